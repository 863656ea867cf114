"""Which files a run contributes to a checkpoint (``writer``), how a resume is planned and applied (``resume``),
publishing finished checkpoints (``publish``) and ``ckpt_path`` resolution. The folder itself (barrier, shards,
manifest last) belongs to the strategy."""
