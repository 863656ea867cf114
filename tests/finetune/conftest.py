"""Fixtures of the fine-tuning tests."""

import pytest


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny Llama saved with ``save_pretrained`` (the quantized bases load it with a ``BitsAndBytesConfig``)."""
    from finetune_common import tiny_llama

    path = tmp_path_factory.mktemp("base")
    tiny_llama().save_pretrained(str(path))
    return str(path)
