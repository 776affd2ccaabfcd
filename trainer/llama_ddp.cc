// `bazel run //trainer:llama_ddp [-- --set=training.steps=50]`: trains
// trainer/plans/llama_ddp.textproto, compiled in (see run.h for how it finds or launches its
// ranks).
#include "trainer/run.h"

namespace {
constexpr char kPlan[] =
#include "trainer/llama_ddp_text.inc"
    ;
}  // namespace

int main(int argc, char** argv) {
  return plait::trainer::RunMain(argc, argv, {kPlan, "trainer/plans/llama_ddp.textproto"});
}
