"""The built-in base model `trainfleet/tiny-llama`, and how the node finds any base model.

`resolve_model` takes a built-in name (built here), a local model directory (used as is), or a hub id
(downloaded by trainer.download into ``<cache_dir>/hub/models--<org>--<name>/<commit sha>/``, on many
connections, resumable, without the weight formats transformers will not read).

The tiny model is made here, offline and deterministically: a byte-level BPE tokenizer trained on the
corpus in `trainer/assets/`, and a small `LlamaForCausalLM` whose weights come from a fixed seed. It is
saved with `save_pretrained` (safetensors) into ``<cache_dir>/trainfleet--tiny-llama/<recipe hash>/``.
The hash covers everything the files are made from (the spec, the corpus, `BUILD_VERSION`), so a changed
recipe lands in a new directory and an unchanged one is reused. Building is safe across processes: one
builder at a time holds a file lock, builds into a temporary directory and renames it into place.

The model is random, not pretrained. Its projections start near unit gain (std ~1/sqrt(hidden)) rather
than transformers' 0.02, and its untied output head wide enough for confident predictions, so that a LoRA
adapter on those projections learns the bundled templated dataset within a couple of epochs (measured
with the example job: eval loss ~7.8 at step 0, ~3 after 90 steps).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import BUILTIN_MODELS, HUB_ID_PATTERN
from trainer.errors import DownloadError, ModelUnavailable
from trainer.fslock import exclusive

if TYPE_CHECKING:
    from trainer.download import DownloadStats, HubAccess

TINY_NAME = "trainfleet/tiny-llama"
BUILD_VERSION = 1  # bump when the build code changes what it writes
CORPUS = Path(__file__).parent / "assets" / "tiny-corpus.txt"
PAD, BOS, EOS = "<pad>", "<s>", "</s>"  # ids 0, 1, 2


@dataclass(frozen=True)
class TinySpec:
    """Every number the tiny model is made from; part of its recipe hash."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    max_positions: int = 512
    init_std: float = 0.1  # attention and MLP weights (initializer_range), about 1/sqrt(hidden_size)
    embed_std: float = 0.3  # input embeddings
    head_std: float = 0.1  # output head (untied): logits can reach ~13, enough for confident predictions
    seed: int = 0


TINY_SPEC = TinySpec()
# The same recipe at GPT-2 small's shape (~116M parameters with the tiny vocabulary), for bench/trainer.py on
# a GPU: large enough that the matrix units, not Python, set the pace. Pass it to `build_tiny` (its own hash
# and directory); the init scales keep the projections near unit gain and the logits as large as the tiny's.
SMALL_SPEC = TinySpec(
    hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, init_std=0.036, head_std=0.04
)
SIZES = {"tiny": TINY_SPEC, "small": SMALL_SPEC}


def default_cache_dir() -> Path:
    """Where base models are built when the job names no cache_dir: ``$XDG_CACHE_HOME/trainfleet/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainfleet" / "models"


def recipe_hash(spec: TinySpec = TINY_SPEC, corpus: Path = CORPUS) -> str:
    """The hex digest (16 chars) naming the directory that `spec` and `corpus` build into."""
    digest = hashlib.sha256()
    meta = {"build_version": BUILD_VERSION, "name": TINY_NAME, "spec": asdict(spec)}
    digest.update(json.dumps(meta, sort_keys=True).encode())
    digest.update(corpus.read_bytes())
    return digest.hexdigest()[:16]


def model_dir(cache_dir: Path, name: str, content_hash: str) -> Path:
    """``<cache_dir>/<name with '/' replaced by '--'>/<hash>``."""
    return cache_dir / name.replace("/", "--") / content_hash


def build_tiny(cache_dir: Path, spec: TinySpec = TINY_SPEC, corpus: Path = CORPUS) -> Path:
    """Return the tiny model's directory under `cache_dir`, building it first if it is not there.

    Safe to call from several processes at once: all return the same directory, built once. A directory
    that exists is complete (it only ever appears by an atomic rename) and is reused as is.
    """
    final = model_dir(cache_dir, TINY_NAME, recipe_hash(spec, corpus))
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(final.parent / f".{final.name}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
        try:
            write_tiny(staging, spec, corpus)
            staging.chmod(0o755)  # mkdtemp made it private
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


def resolve_model(name_or_path: str, cache_dir: Path | None = None) -> Path:
    """The local directory of a base model; `fetch_model` without the download figures."""
    return fetch_model(name_or_path, cache_dir)[0]


def fetch_model(
    name_or_path: str, cache_dir: Path | None = None, access: HubAccess | None = None
) -> tuple[Path, DownloadStats | None]:
    """The local directory of a base model, and the download figures when it came from the hub.

    Built-in names are built (or reused) under `cache_dir` (default `default_cache_dir()`); an existing
    local path is used as is; a hub id ('org/name') is downloaded under ``<cache_dir>/hub/`` from
    `access` (default: HF_ENDPOINT, HF_TOKEN and FLEET_HUB_CONNECTIONS from the environment). Raises
    ModelUnavailable for anything else, naming the repo and saying whether a token was set.
    """
    if name_or_path in BUILTIN_MODELS:
        if name_or_path != TINY_NAME:  # pragma: no cover - BUILTIN_MODELS and this module disagree
            raise ModelUnavailable(f"{name_or_path}: listed as built in, but trainer.tiny cannot build it")
        return build_tiny(cache_dir or default_cache_dir()), None
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve(), None
    if path.exists():
        raise ModelUnavailable(f"base_model {name_or_path!r} is a file; a model directory is needed")
    if not re.fullmatch(HUB_ID_PATTERN, name_or_path):
        raise ModelUnavailable(
            f"base_model {name_or_path!r} is not built in ({', '.join(BUILTIN_MODELS)}), not a local "
            "directory, and not a hub id like 'org/name'"
        )
    from trainer.download import HubAccess, model_files, snapshot

    try:
        access = access or HubAccess.from_env(os.environ)
        got = snapshot(name_or_path, cache_dir or default_cache_dir(), access, "model", model_files)
    except DownloadError as exc:
        raise ModelUnavailable(
            f"base_model {name_or_path!r} is not a local directory; from the hub: {exc}"
        ) from exc
    return got.path, got.stats


def write_tiny(out: Path, spec: TinySpec = TINY_SPEC, corpus: Path = CORPUS) -> None:
    """Write the tokenizer and the model for `spec` into the existing directory `out` (no caching)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = _train_tokenizer(spec, corpus)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        initializer_range=spec.init_std,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG alone
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, spec.embed_std)
            model.get_output_embeddings().weight.normal_(0.0, spec.head_std)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one tiny shard: the bar is noise in a job's log
    try:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _train_tokenizer(spec: TinySpec, corpus: Path) -> Any:
    """A byte-level BPE tokenizer trained on `corpus`, wrapped as a PreTrainedTokenizerFast that adds
    BOS in front of every text (as Llama's does) and never EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus.read_text(encoding="utf-8")
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=spec.max_positions,
        padding_side="right",
    )
