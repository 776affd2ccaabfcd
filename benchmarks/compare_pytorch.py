"""plait against PyTorch 2.13 on the CPU, side by side: training steps of the
medium model (benchmarks/bench_setup.h: Llama, hidden 512, 8 layers, 8 heads,
SwiGLU 1376, vocab 4096, about 29M parameters; 8 sequences of 256 tokens per
rank), or with --shape=real of a real one (Qwen2.5-0.5B's widths and its
151,936-token vocabulary, tied embeddings, 2 of its 24 layers: 166M parameters;
one sequence of 512 tokens per rank), in fp32 and bf16:

  plait                 //trainer:train, one process
  PyTorch eager         transformers' LlamaForCausalLM, one process
  PyTorch compile       the same under torch.compile
  plait FSDP            //trainer:train, FSDP over 2 ranks (Gloo)
  PyTorch FSDP2         fully_shard on every layer and the root, Gloo,
                        2 processes

A step is forward, backward, clipping to norm 1.0 and AdamW, with one compute
thread per process, or --threads=N for the one-process rows (the FSDP rows keep
one thread per rank: two ranks fill two cores). bf16 means
plait's model in bf16 with fp32 masters in its optimizer; for PyTorch,
autocast to bf16 around fp32 parameters (eager and compile) and FSDP2's
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), which is plait's
FSDP in bf16. Not part of the test suite; run it in the venv tools/setup.sh
builds, from the repository root:

  /opt/plait/venv/bin/python benchmarks/compare_pytorch.py

It builds //trainer:train with --config=opt first (or takes --plait_train),
and prints tokens/s (median over the timed steps; the first steps, which
compile or fault memory in, are not timed) and plait's ratio to each, by wall
time and by CPU time. On a machine other jobs share, wall time measures the
share of the cores each run got as much as its speed; CPU time (of all the
processes of a run, Gloo's threads included) is disturbed less. With the
default 1 + 3 steps a run takes about 3 minutes on 2 quiet cores; longer on
a busy machine, and the first time, while torch.compile fills its cache.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The shapes (model_type, the config's fields, micro-batch, sequence length):
# the medium one (benchmarks/bench_setup.h's MediumModel) and a real one
# (model_bench's Qwen2.5-0.5B row).
SHAPES = {
    "medium": ("llama",
               dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                    num_attention_heads=8, num_key_value_heads=8,
                    vocab_size=4096, max_position_embeddings=2048,
                    rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=False),
               8, 256),
    "real": ("qwen2",
             dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                  num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=True),
             1, 512),
}
MODEL_TYPE, CONFIG, MICRO_BATCH, SEQ_LEN = SHAPES["medium"]
LR = 3e-4


def use_shape(name):
    """Makes `name` the shape every run below trains."""
    global MODEL_TYPE, CONFIG, MICRO_BATCH, SEQ_LEN
    MODEL_TYPE, CONFIG, MICRO_BATCH, SEQ_LEN = SHAPES[name]


def plait_plan(dtype, ranks, threads, steps, metrics_file):
    """The trainer plan of one plait run (plan/plan.proto)."""
    config = " ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
                      for k, v in CONFIG.items())
    dtype_field = {"fp32": "DTYPE_FLOAT32", "bf16": "DTYPE_BFLOAT16"}[dtype]
    parallel = ""
    if ranks > 1:
        parallel = (f'mesh {{ dims {{ name: "dp" size: {ranks} }} }}\n'
                    'prepare { fsdp { mesh_dim: "dp" } }\n')
    return f"""
model {{
  config {{ model_type: "{MODEL_TYPE}" {config} }}
  init {{ seed: 1 }}
  dtype: {dtype_field}
}}
{parallel}
optimizer {{ adamw {{ beta2: 0.95 }} weight_decay: 0.1
             clipping {{ max_norm: 1.0 }} }}
schedule {{ lr: {LR} warmup {{ steps: 1 }} cosine {{}} }}
data {{ synthetic {{ seed: 7 }} }}
training {{
  steps: {steps}
  micro_batch: {MICRO_BATCH}
  seq_len: {SEQ_LEN}
  global_batch: {MICRO_BATCH * ranks}
  eval_batches: 1  # after the last step, outside its timing
  log_every: 1000
  metrics_file: "{metrics_file}"
  compute_threads_per_rank: {threads}
}}
"""


def run_plait(binary, dtype, ranks, threads, warmup, steps):
    """plait's trainer: the median wall time of the timed steps (from its
    metrics file), and the CPU seconds of all its processes per timed step,
    read from /proc when the metrics file shows the warmup and the timed
    steps done."""
    with tempfile.TemporaryDirectory() as folder:
        metrics = os.path.join(folder, "metrics.jsonl")
        plan = os.path.join(folder, "plan.textproto")
        with open(plan, "w") as f:
            f.write(plait_plan(dtype, ranks, threads, warmup + steps, metrics))
        trainer = subprocess.Popen([binary, f"--plan={plan}"],
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        cpu_at = {}  # steps done -> CPU seconds then
        while trainer.poll() is None:
            done = count_lines(metrics)
            if done in (warmup, warmup + steps) and done not in cpu_at:
                cpu_at[done] = process_tree_cpu_seconds(trainer.pid)
            time.sleep(0.02)
        if trainer.returncode != 0:
            raise RuntimeError(f"plait's trainer failed:\n"
                               f"{trainer.stderr.read()}")
        if len(cpu_at) != 2:
            raise RuntimeError("plait's trainer: missed a step boundary")
        with open(metrics) as f:
            rows = [json.loads(line) for line in f]
    tokens = MICRO_BATCH * SEQ_LEN * ranks
    return {"tokens_per_step": tokens,
            "wall_s": statistics.median(tokens / row["tokens_per_s"]
                                        for row in rows[warmup:]),
            "cpu_s": (cpu_at[warmup + steps] - cpu_at[warmup]) / steps}


def count_lines(path):
    try:
        with open(path) as f:
            return sum(1 for line in f if line.endswith("\n"))
    except FileNotFoundError:
        return 0


def process_tree_cpu_seconds(pid):
    """User and system CPU seconds so far of pid and its descendants (every
    thread), from /proc."""
    total = 0
    pending = [pid]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass  # exited meanwhile
    return total / os.sysconf("SC_CLK_TCK")


# ---- PyTorch, in worker processes (one per configuration) ----

def pytorch_model(torch, transformers):
    if MODEL_TYPE == "qwen2":
        config = transformers.Qwen2Config(**CONFIG)
        model = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**CONFIG)
        model = transformers.LlamaForCausalLM
    torch.manual_seed(1)
    return model(config).float().train()


def timed_steps(torch, model, optimizer, autocast, warmup, steps, sync=None):
    """Runs warmup + steps training steps on a fixed random batch; returns
    the seconds of the first step and, over the timed steps, the median
    seconds and CPU seconds of this process per step."""
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(CONFIG["vocab_size"], (MICRO_BATCH, SEQ_LEN),
                              generator=generator)
    wall, cpu = [], []
    for _ in range(warmup + steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if sync is not None:
            sync()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"first_step_s": wall[0],
            "wall_s": statistics.median(wall[warmup:]),
            "cpu_s": statistics.median(cpu[warmup:])}


def adamw(torch, params):
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95),
                             weight_decay=0.1)


def worker_single(mode, dtype, threads, warmup, steps):
    import torch
    import transformers
    torch.set_num_threads(threads)
    model = pytorch_model(torch, transformers)
    optimizer = adamw(torch, model.parameters())
    if mode == "compile":
        model = torch.compile(model)
    result = timed_steps(torch, model, optimizer, dtype == "bf16", warmup,
                         steps)
    return dict(result, tokens_per_step=MICRO_BATCH * SEQ_LEN)


def fsdp_rank(rank, dtype, warmup, steps, shape, port, queue):
    use_shape(shape)  # a spawned process imports this module afresh
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = pytorch_model(torch, transformers)
    policy = MixedPrecisionPolicy()
    if dtype == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                      reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = adamw(torch, model.parameters())
    result = timed_steps(torch, model, optimizer, False, warmup, steps,
                         sync=dist.barrier)
    queue.put(dict(result, rank=rank, tokens_per_step=2 * MICRO_BATCH
                   * SEQ_LEN))
    dist.destroy_process_group()


def worker_fsdp(dtype, warmup, steps, shape):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(fsdp_rank,
                       args=(dtype, warmup, steps, shape, port, queue),
                       nprocs=2, start_method="spawn")
    ranks = sorted((queue.get() for _ in range(2)), key=lambda r: r["rank"])
    # Rank 0's wall time; both ranks' CPU time.
    return dict(ranks[0], cpu_s=ranks[0]["cpu_s"] + ranks[1]["cpu_s"])


def run_worker(mode, dtype, threads, warmup, steps, shape):
    """One PyTorch configuration in a fresh process (its own threads, memory
    and compile state)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--dtype", dtype,
         "--threads", str(threads), "--warmup", str(warmup), "--steps",
         str(steps), "--shape", shape],
        capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"PyTorch {mode} {dtype} failed:\n"
                           f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plait_train", default="",
                        help="plait's trainer binary; default: build "
                             "//trainer:train with --config=opt")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed first steps (compile, page faults)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--shape", default="medium", choices=sorted(SHAPES),
                        help="medium: the 29M benchmark model; real: "
                             "Qwen2.5-0.5B's widths and vocabulary, 2 layers")
    parser.add_argument("--threads", type=int, default=1,
                        help="compute threads of the one-process rows")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    use_shape(args.shape)

    if args.worker:
        if args.worker == "fsdp":
            result = worker_fsdp(args.dtype, args.warmup, args.steps,
                                 args.shape)
        else:
            result = worker_single(args.worker, args.dtype, args.threads,
                                   args.warmup, args.steps)
        print(json.dumps(result))
        return

    binary = args.plait_train
    if not binary:
        subprocess.run(["bazel", "build", "--config=opt", "//trainer:train"],
                       check=True)
        binary = os.path.join("bazel-bin", "trainer", "train")
    if not os.access(binary, os.X_OK):
        sys.exit(f"compare_pytorch: no plait trainer at {binary}; build it "
                 "with bazel build --config=opt //trainer:train")

    rows = []  # (name, dtype, result or None)
    for dtype in args.dtypes.split(","):
        for name, kind in CONFIGURATIONS:
            print(f"running {name} {dtype} ...", file=sys.stderr, flush=True)
            try:
                if kind.startswith("plait"):
                    ranks = 2 if kind == "plait_fsdp" else 1
                    result = run_plait(binary, dtype, ranks,
                                       1 if ranks > 1 else args.threads,
                                       args.warmup, args.steps)
                else:
                    threads = 1 if kind == "fsdp" else args.threads
                    result = run_worker(kind, dtype, threads, args.warmup,
                                        args.steps, args.shape)
            except RuntimeError as error:
                print(error, file=sys.stderr)
                result = None
            rows.append((name, dtype, result))
    print_table(rows)


# (row name, how it runs); plait's rows are what the others are compared to.
CONFIGURATIONS = [
    ("plait", "plait"),
    ("PyTorch eager", "eager"),
    ("PyTorch compile", "compile"),
    ("plait FSDP x2", "plait_fsdp"),
    ("PyTorch FSDP2 x2", "fsdp"),
]


def rate(result, seconds):
    """Tokens per second of wall time ("wall_s") or of CPU time ("cpu_s")."""
    return result["tokens_per_step"] / result[seconds]


def print_table(rows):
    """tokens/s by wall time and by CPU time (tokens per CPU-second of all
    the processes: about what they would do with a core each on an idle
    machine), and plait's ratio to each row (plait FSDP's for FSDP2)."""
    results = {(name, dtype): result for name, dtype, result in rows}
    print(f"\n{'':18}{'dtype':6}{'tokens/s':>10}{'tokens/cpu-s':>14}"
          f"{'plait/this':>12}{'(cpu)':>7}  note")
    for name, dtype, result in rows:
        if result is None:
            print(f"{name:18}{dtype:6}{'failed':>10}")
            continue
        plait = results.get(("plait FSDP x2" if "FSDP" in name else "plait",
                             dtype))
        ratio = ratio_cpu = "-"
        if plait is not None:
            ratio = f"{rate(plait, 'wall_s') / rate(result, 'wall_s'):.2f}"
            ratio_cpu = f"{rate(plait, 'cpu_s') / rate(result, 'cpu_s'):.2f}"
        note = ""
        if "first_step_s" in result:
            note = f"first step {result['first_step_s']:.0f} s"
        print(f"{name:18}{dtype:6}{rate(result, 'wall_s'):>10.0f}"
              f"{rate(result, 'cpu_s'):>14.0f}{ratio:>12}{ratio_cpu:>7}"
              f"  {note}")


if __name__ == "__main__":
    main()
