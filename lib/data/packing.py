"""Packing tokenised sequences into fixed-length rows, and completion-only (assistant-only) loss masks.

A packed row holds several whole sequences one after the other, with ``position_ids`` that restart at 0 where each
sequence starts and no ``attention_mask``. transformers' causal LMs (Llama and the models built on its masking
utilities, ``transformers.masking_utils.find_packed_sequence_indices``) read those restarts and give every sequence
its own causal block, on CPU SDPA as on other attention kernels, so a token never attends to another sequence: the
path ``transformers.DataCollatorWithFlattening`` uses. This needs the model's cache off while training
(``TrainingArguments.use_cache=False``, the default). The packing strategies mirror TRL's ``pack_dataset``:
``"bfd"`` (best-fit decreasing) and ``"greedy"`` (in order, a new row when the next sequence does not fit).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

IGNORE_INDEX = -100
STRATEGIES = ("bfd", "greedy")


def pack_indices(lengths: Sequence[int], max_length: int, strategy: str = "bfd") -> list[list[int]]:
    """Which sequences go into which row: a list of rows, each the indices of its sequences in packing order.

    Args:
        lengths (Sequence[int]): tokens per sequence, each in ``1..max_length``.
        max_length (int): tokens per row.
        strategy (str): ``"bfd"`` (best-fit decreasing, TRL's ``bfd``: longest first, each into the fullest row it
            fits; fewest rows) or ``"greedy"`` (dataset order, a new row when the next one does not fit).

    Returns:
        list[list[int]]: every index exactly once; the lengths in a row sum to at most ``max_length``.

    Raises:
        ValueError: an unknown strategy (naming the valid ones), ``max_length < 1``, or a length outside
            ``1..max_length`` (naming the sequence).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown packing strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}.")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int (tokens per row), got {max_length!r}.")
    for i, n in enumerate(lengths):
        if not 1 <= n <= max_length:
            raise ValueError(f"Sequence {i} has {n} tokens; packing needs 1..max_length={max_length} tokens per "
                             "sequence (pass truncate=True to pack_dataset to cut longer ones).")
    if strategy == "greedy":
        rows: list[list[int]] = []
        free = 0
        for i, n in enumerate(lengths):
            if not rows or n > free:
                rows.append([])
                free = max_length
            rows[-1].append(i)
            free -= n
        return rows
    return _best_fit_decreasing(lengths, max_length)


def _best_fit_decreasing(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free tokens, row), sorted: the first entry >= n is the best fit
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        k = bisect.bisect_left(free, (n, -1))
        if k == len(free):
            rows.append([i])
            room, row = max_length - n, len(rows) - 1
        else:
            room, row = free.pop(k)
            rows[row].append(i)
            room -= n
        if room > 0:
            bisect.insort(free, (room, row))
    return rows


def pack_dataset(rows: Iterable[Mapping[str, Any]], max_length: int, *, strategy: str = "bfd",
                 pad_token_id: int = 0, truncate: bool = False) -> list[dict[str, list[int]]]:
    """Pack tokenised rows into rows of exactly ``max_length`` tokens (mirrors TRL's ``pack_dataset``).

    Each output row has ``input_ids``, ``labels`` and ``position_ids`` (Python lists of ``max_length`` ints, so the
    default collator stacks them into ``(batch, max_length)`` tensors) and no ``attention_mask`` (see the module
    docstring: the restarts of ``position_ids`` isolate the sequences). The labels of a sequence are its own
    (``labels`` of the input row, default its ``input_ids``), except that the first token of every packed sequence
    gets ``-100``: a causal LM predicts token ``t`` from token ``t-1``, which there belongs to the previous
    sequence, and an unpacked row never trains its first token either. The tail of a row is padding:
    ``pad_token_id``, label ``-100``, positions restarting at 0 (a block of its own that no real token sees).
    So a packed step has the loss terms of the same sequences unpacked and padded.

    Args:
        rows (Iterable[Mapping]): rows with ``input_ids`` (list of ints or a 1-D tensor) and optionally ``labels``
            (same length; ``-100`` where no loss is wanted, e.g. from :func:`completion_only_row`). Other fields
            are dropped.
        max_length (int): tokens per output row.
        strategy (str): ``"bfd"`` or ``"greedy"`` (see :func:`pack_indices`).
        pad_token_id (int): the token id of the padding tail.
        truncate (bool): cut sequences longer than ``max_length`` to their first ``max_length`` tokens (TRL
            truncates); by default such a sequence is an error.

    Returns:
        list[dict[str, list[int]]]: the packed rows.

    Raises:
        ValueError: a row without ``input_ids``, labels of another length, an empty sequence, a too-long one
            without ``truncate``, or a bad ``strategy`` / ``max_length``.
    """
    seqs = [_sequence(i, row, max_length if truncate else None) for i, row in enumerate(rows)]
    packed = []
    for bin_ in pack_indices([len(ids) for ids, _ in seqs], max_length, strategy):
        ids_row: list[int] = []
        labels_row: list[int] = []
        positions: list[int] = []
        for i in bin_:
            ids, labels = seqs[i]
            ids_row += ids
            labels_row += [IGNORE_INDEX] + labels[1:]
            positions += range(len(ids))
        pad = max_length - len(ids_row)
        packed.append({"input_ids": ids_row + [pad_token_id] * pad, "labels": labels_row + [IGNORE_INDEX] * pad,
                       "position_ids": positions + list(range(pad))})
    return packed


def _sequence(i: int, row: Mapping[str, Any], cut: int | None) -> tuple[list[int], list[int]]:
    if not isinstance(row, Mapping) or "input_ids" not in row:
        raise ValueError(f"Row {i} has no 'input_ids' field (got {type(row).__name__}); pack_dataset needs "
                         "tokenised rows such as {'input_ids': [...], 'labels': [...]}.")
    ids = [int(t) for t in row["input_ids"]]
    labels = [int(t) for t in row["labels"]] if row.get("labels") is not None else list(ids)
    if len(labels) != len(ids):
        raise ValueError(f"Row {i}: 'labels' has {len(labels)} entries but 'input_ids' has {len(ids)}.")
    return (ids[:cut], labels[:cut]) if cut is not None else (ids, labels)


def completion_only_row(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> dict[str, list[int]]:
    """One training row whose loss covers the completion only (TRL's ``completion_only_loss``): ``input_ids`` is
    prompt + completion, ``labels`` is ``-100`` on the prompt and the completion's ids after it.

    Args:
        prompt_ids (Sequence[int]): the prompt's token ids.
        completion_ids (Sequence[int]): the completion's token ids (at least one).

    Raises:
        ValueError: an empty completion (the row would carry no loss).
    """
    if len(completion_ids) == 0:
        raise ValueError("completion_ids is empty: the row would have no token to train on.")
    ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * len(prompt_ids) + ids[len(prompt_ids):]}


def assistant_only_row(input_ids: Sequence[int], assistant_masks: Sequence[int]) -> dict[str, list[int]]:
    """One training row whose loss covers the assistant's turns only (TRL's ``assistant_only_loss``): ``labels`` is
    ``input_ids`` where ``assistant_masks`` is 1 and ``-100`` elsewhere. ``assistant_masks`` is what
    ``tokenizer.apply_chat_template(..., return_dict=True, return_assistant_tokens_mask=True)`` returns.

    Args:
        input_ids (Sequence[int]): the conversation's token ids.
        assistant_masks (Sequence[int]): 1 on assistant tokens, 0 elsewhere, same length.

    Raises:
        ValueError: lengths differ.
    """
    if len(input_ids) != len(assistant_masks):
        raise ValueError(f"assistant_masks has {len(assistant_masks)} entries but input_ids has {len(input_ids)}.")
    ids = [int(t) for t in input_ids]
    return {"input_ids": ids, "labels": [t if m else IGNORE_INDEX for t, m in zip(ids, assistant_masks)]}
