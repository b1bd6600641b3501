"""The Hugging Face Hub without a network: timm's pretrained weights (vit/weights/read.py) and Hugging Face
datasets (vit/data/sources/hf.py) come through it, and offline huggingface_hub retries each request for most of a
minute, with a warning per try, before it falls back to the cache. These two helpers find out first and say so once."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from urllib.parse import urlparse


def hub_host() -> str:
    """The host of the Hub endpoint (HF_ENDPOINT, default huggingface.co)."""
    from huggingface_hub import constants

    return urlparse(constants.ENDPOINT).hostname or ""


def host_reachable(host: str, timeout: float = 3.0) -> bool:
    """A TCP connection to `host`:443 opens, and the hub's offline mode (HF_HUB_OFFLINE=1) is off."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or not host:
        return False
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def offline_hub(enabled: bool) -> Iterator[None]:
    """The hub's offline mode (huggingface_hub's, and the datasets library's copy of it when it is imported) for
    the duration: the cache is read without a request, and what is not cached fails at once."""
    from huggingface_hub import constants

    datasets_config = sys.modules.get("datasets.config")
    before = constants.HF_HUB_OFFLINE, getattr(datasets_config, "HF_HUB_OFFLINE", None)
    constants.HF_HUB_OFFLINE = before[0] or enabled
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = before[1] or enabled
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before[0]
        if datasets_config is not None:
            datasets_config.HF_HUB_OFFLINE = before[1]
