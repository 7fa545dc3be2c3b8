"""Parses `vllm serve` command lines with the pinned vLLM's own parser and checks that
every worker would get the memory its plan says it needs, computed as that vLLM does.

Usage: python vllm_check.py CASES.json   (the venv's python from tests/engines/vllm.sh)

Each case: {"name", "args": [...after the program...], "env": {...},
"model": {"layers", "kv_heads", "head_dim", "dtype_bytes"}, "context", "concurrency",
"workers": [{"reserved", "total", "need"}, ...] in vLLM's rank order, "adapters": [names],
"runner": "auto" or "pooling" (an embedding model)}.
Prints one line per worker and exits 1 when any case fails.

What is mirrored, from vLLM 0.33.0:
- the tool-call parser named by `--tool-call-parser`: looked up as the server does at
  start (`vllm/tool_parsers/abstract_tool_parser.py` `ToolParserManager.get_tool_parser`);
- the parser: `vllm serve`'s (`vllm/entrypoints/cli/serve.py` `ServeSubcommand.subparser_init`
  calls `vllm/entrypoints/common/cli_args.py` `make_arg_parser`; `validate` calls
  `validate_parsed_serve_args`), then `AsyncEngineArgs.from_cli_args` and the
  `CacheConfig` it builds (`vllm/engine/arg_utils.py`);
- LoRA: `--lora-modules` as the parser reads it (`LoRAParserAction`), and the slot flags
  through `vllm/config/lora.py` `LoRAConfig` (its allowed ranks and validator);
- an embedding model's `--runner pooling` (`vllm/config/model.py` `RunnerOption`);
- the layers of each pipeline stage: `vllm/distributed/utils.py` `get_pp_indices`
  (it reads `VLLM_PP_LAYER_PARTITION`), called here;
- KV heads per rank: `vllm/config/model.py` `ModelConfig.get_num_kv_heads`
  (max(1, heads // tp)); a block's bytes per layer: `vllm/v1/kv_cache_interface.py`
  `AttentionSpec.page_size_bytes` (heads × block_size × (K + V head size) × dtype);
- the startup check: `vllm/v1/worker/utils.py` `request_memory` (free memory at start
  must be at least ceil(total × gpu_memory_utilization));
- each worker's KV memory: `vllm/v1/worker/gpu_worker.py`
  `Worker.determine_available_memory` (kv_cache_memory_bytes when given, else the
  requested memory minus what the profile run consumed);
- the blocks: `vllm/v1/core/kv_cache_planning.py` `get_kv_cache_configs` (each worker's
  memory // its bytes per block, then every worker cut to the fewest; one block is the
  block pool's null block) and `_check_enough_kv_cache_memory`.
"""

import json
import math
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU here: vLLM's CPU platform

from vllm.config import CacheConfig  # noqa: E402
from vllm.config.lora import LoRAConfig  # noqa: E402
from vllm.distributed.utils import get_pp_indices  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

import vllm  # noqa: E402


def parse(argv):
    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(required=False, dest="subparser")
    make_arg_parser(sub.add_parser("serve"))
    args = parser.parse_args(argv)
    if args.subparser != "serve":
        raise ValueError(f"not `vllm serve`: {argv[:1]}")
    validate_parsed_serve_args(args)
    # The server looks its tool parser up by name at start
    # (`ToolParserManager.get_tool_parser`): a name it does not know fails there.
    if args.tool_call_parser is not None:
        ToolParserManager.get_tool_parser(args.tool_call_parser)
    engine = AsyncEngineArgs.from_cli_args(args)
    cache = CacheConfig(
        block_size=engine.block_size or 16,  # CUDA's default block size
        gpu_memory_utilization=engine.gpu_memory_utilization,
        kv_cache_memory_bytes=engine.kv_cache_memory_bytes,
        cache_dtype=engine.kv_cache_dtype,
    )
    return args, engine, cache


def check(case):
    problems = []
    lines = []
    args, engine, cache = parse(case["args"])
    if args.model_tag is None:
        problems.append("no model")
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    workers = case["workers"]
    if tp * pp != len(workers):
        return [f"TP {tp} × PP {pp} != {len(workers)} workers"], lines
    if engine.max_model_len != case["context"] or engine.max_num_seqs != case["concurrency"]:
        problems.append(f"--max-model-len {engine.max_model_len} --max-num-seqs {engine.max_num_seqs}")
    # LoRA adapters: every one the plan serves under its name, in slots vLLM's own
    # LoRAConfig accepts (a rank it allows, max_cpu_loras at least max_loras).
    adapters = case.get("adapters", [])
    if adapters or engine.enable_lora:
        if not engine.enable_lora:
            problems.append(f"adapters {adapters} without --enable-lora")
        served = [m.name for m in (args.lora_modules or [])]
        if served != adapters:
            problems.append(f"--lora-modules serves {served}, the plan {adapters}")
        if engine.max_loras != len(adapters):
            problems.append(f"--max-loras {engine.max_loras} for {len(adapters)} adapters")
        try:
            LoRAConfig(
                max_lora_rank=engine.max_lora_rank,
                max_loras=engine.max_loras,
                max_cpu_loras=engine.max_cpu_loras,
            )
        except Exception as e:  # noqa: BLE001 (pydantic's validation error, said as is)
            problems.append(f"vLLM's LoRAConfig refuses the flags: {e}")
        lines.append(
            f"{case['name']}: {len(adapters)} LoRA adapters, --max-loras {engine.max_loras} "
            f"--max-lora-rank {engine.max_lora_rank}"
        )
    # An embedding model runs vLLM's pooling runner (its sequences still hold a KV
    # cache: the memory check below is the same).
    runner = case.get("runner", "auto")
    if engine.runner != runner:
        problems.append(f"--runner {engine.runner}, the plan {runner}")
    elif runner == "pooling":
        lines.append(f"{case['name']}: --runner pooling (embeddings)")
    model = case["model"]
    partition = case["env"].get("VLLM_PP_LAYER_PARTITION")
    if partition is None:
        os.environ.pop("VLLM_PP_LAYER_PARTITION", None)
    else:
        os.environ["VLLM_PP_LAYER_PARTITION"] = partition
    block = cache.block_size
    dtype = 1 if str(cache.cache_dtype).startswith("fp8") else model["dtype_bytes"]
    heads = max(1, model["kv_heads"] // tp)
    page_per_layer = heads * block * 2 * model["head_dim"] * dtype
    # The blocks the plan's sequences take at once: every sequence at full context.
    seq_blocks = math.ceil(case["context"] / block)
    wanted_blocks = case["concurrency"] * seq_blocks
    util = cache.gpu_memory_utilization
    kv_given = cache.kv_cache_memory_bytes
    per_worker = []
    for rank, w in enumerate(workers):
        stage = rank // tp
        start, end = get_pp_indices(model["layers"], stage, pp)
        layers = end - start
        bytes_per_block = page_per_layer * layers
        plan_kv = bytes_per_block * wanted_blocks
        non_kv = w["need"] - plan_kv
        requested = math.ceil(w["total"] * util)
        # request_memory: the plan holds `reserved` of the GPU free for this worker.
        if w["reserved"] < requested:
            problems.append(
                f"rank {rank}: startup check fails: {requested} bytes requested "
                f"(total {w['total']} × {util}) > {w['reserved']} reserved (free)"
            )
        available = kv_given if kv_given else requested - non_kv
        per_worker.append((rank, stage, layers, bytes_per_block, available, non_kv, w, requested))
    blocks = [a // b if b else 0 for (_, _, _, b, a, _, _, _) in per_worker]
    fewest = min(blocks)
    for (rank, stage, layers, bpb, available, non_kv, w, requested), own in zip(per_worker, blocks):
        allocated = fewest * bpb
        holds = non_kv + allocated
        gets = holds if kv_given else requested
        lines.append(
            f"{case['name']}: rank {rank} (stage {stage}, {layers} layers): vLLM gives "
            f"{gets / 2**30:.2f} GiB ({allocated / 2**30:.2f} GiB KV, {fewest} blocks) "
            f"for a need of {w['need'] / 2**30:.2f} GiB, {w['reserved'] / 2**30:.2f} GiB reserved"
        )
        if available <= 0:
            problems.append(f"rank {rank}: no memory left for the KV cache ({available} bytes)")
            continue
        # _check_enough_kv_cache_memory, less the null block.
        if available - bpb < seq_blocks * bpb:
            problems.append(f"rank {rank}: one {case['context']}-token sequence does not fit in {available} bytes")
        if gets < w["need"]:
            problems.append(f"rank {rank}: vLLM gives {gets} bytes, the plan needs {w['need']}")
        if holds > w["reserved"]:
            problems.append(f"rank {rank}: holds {holds} bytes, over the {w['reserved']} reserved")
    if fewest - 1 < wanted_blocks:
        problems.append(
            f"{fewest} blocks per worker (one kept back) for {case['concurrency']} × {seq_blocks} blocks"
        )
    return problems, lines


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    print(f"vLLM {vllm.__version__}: {len(cases)} command lines")
    failed = 0
    for case in cases:
        try:
            problems, lines = check(case)
        except (Exception, SystemExit) as e:  # the parser exits on a bad flag
            problems, lines = [f"vLLM refuses it: {type(e).__name__}: {e}"], []
        for line in lines:
            print(line)
        if problems:
            failed += 1
            print(f"FAIL {case['name']}: {' '.join(case['args'])}")
            for p in problems:
                print(f"  {p}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
