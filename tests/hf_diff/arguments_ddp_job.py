"""Run by torchrun with 2 processes (gloo): each rank builds transformers.TrainingArguments and FitArguments with
the same options and writes what scripts read from them (tests/hf_diff/test_arguments_fields.py)."""

import json
import sys
import time
import warnings

import transformers
from taskfit import FitArguments

PROPS = ("world_size", "process_index", "local_process_index", "should_log", "should_save", "train_batch_size",
         "eval_batch_size", "n_gpu")


def main(out: str) -> None:
    kw = dict(output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=3, log_level="info",
              log_level_replica="error", use_cpu=True, report_to="none", ddp_backend="gloo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.TrainingArguments(**kw)
        ours = FitArguments(**kw)
    row = {}
    for name, a in (("hf", hf), ("tf", ours)):
        row[name] = {p: getattr(a, p) for p in PROPS}
        row[name].update(device=a.device.type,  # HF: "cpu:0" from accelerate on every rank, taskfit: "cpu"
                         parallel_mode=getattr(a.parallel_mode, "value", a.parallel_mode),
                         log_level=a.get_process_log_level())
        order = []
        with a.main_process_first(desc="tokenize"):  # the main process runs the block first
            order.append(time.time())
            if a.process_index == 0:
                time.sleep(0.5)
        row[name]["entered"] = order[0]
    rank = ours.process_index
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(row, f)


if __name__ == "__main__":
    main(sys.argv[1])
