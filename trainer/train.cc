// `bazel run //trainer:train -- --plan=FILE [--set=path=value]...`: trains any plan (see
// run.h for how it finds or launches its ranks).
#include "trainer/run.h"

int main(int argc, char** argv) { return plait::trainer::RunMain(argc, argv, {}); }
