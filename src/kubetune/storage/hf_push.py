"""Writing to the Hugging Face Hub: ``kubetune push DIR hf://ORG/NAME`` and ``output.uri: hf://ORG/NAME[@BRANCH]``.

Everything goes through huggingface_hub's ``HfApi`` (its endpoint from ``HF_ENDPOINT``, its token from
``HF_TOKEN`` or ``huggingface-cli login``; on a cluster, ``kubernetes.secrets.hf_token`` puts the Secret in
``HF_TOKEN``). Each write is one commit, and a Hub commit is atomic: a checkpoint folder, or a run's published
results, are in the repository whole or not at all. A repository that does not exist is created **private**
(publishing a model is for its owner to decide); a branch named by ``@BRANCH`` is created from main.

Layout of ``output.uri: hf://ORG/NAME`` (under its ``/PATH`` when it names one):

* the adapter's files at the top (``PeftModel.from_pretrained("ORG/NAME")`` loads it), or the full model's;
* ``merged/``: the merged model when ``output.merge`` made one (``from_pretrained("ORG/NAME", subfolder="merged")``);
* ``README.md``: a model card (base model, method, the run's losses);
* ``kubetune/``: the run's record (spec.yaml, status.json, events.jsonl, result.json; credentials masked);
* ``checkpoints/checkpoint-N/``: checkpoints while the job trains, so a rerun elsewhere resumes from them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import constants as C
from ..errors import SourceError
from ._common import walk_files
from .location import Location

__all__ = ["HfTarget", "push_path", "verify"]

_CHECKPOINTS = "checkpoints"
_RECORD = "kubetune"
_MAIN = "main"


def _api() -> Any:
    import os

    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)  # read now: huggingface_hub reads it once, at import


def _error(e: Exception, loc: Location, what: str) -> SourceError:
    """A huggingface_hub error as one message naming the URI (never the token)."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status in (401, 403):
        return SourceError(f"{loc.safe}: the Hub refused to {what} ({status})",
                           hint="set HF_TOKEN to a token with write access to the repository (on a cluster: kubernetes.secrets.hf_token)")
    return SourceError(f"{loc.safe}: cannot {what} on the Hub: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))


def _prefix(loc: Location) -> str:
    return f"{loc.path.strip('/')}/" if loc.path.strip("/") else ""


def ensure_repo(loc: Location) -> None:
    """Create the repository (private) and the branch when they do not exist."""
    api = _api()
    try:
        api.create_repo(loc.host, repo_type=loc.repo_type, private=True, exist_ok=True)
        if loc.revision and loc.revision != _MAIN:
            api.create_branch(loc.host, branch=loc.revision, repo_type=loc.repo_type, exist_ok=True)
    except Exception as e:  # huggingface_hub's HTTP errors, connection errors
        raise _error(e, loc, "create the repository") from None


def push_path(path: Path, loc: Location) -> str:
    """Upload a file or folder to ``loc`` in one commit; returns the commit's URL.

    Raises:
        SourceError: the Hub refused or could not be reached, naming the URI.
    """
    ensure_repo(loc)
    api = _api()
    try:
        if path.is_dir():
            info = api.upload_folder(folder_path=str(path), repo_id=loc.host, repo_type=loc.repo_type, revision=loc.revision,
                                     path_in_repo=loc.path.strip("/") or None, commit_message=f"kubetune push {path.name}")
        else:
            folder = not loc.path.strip("/") or loc.uri.endswith("/")  # hf://ORG/NAME/DIR/: the file goes in as DIR/NAME
            name = f"{loc.path.strip('/')}/{path.name}".lstrip("/") if folder else loc.path.strip("/")
            info = api.upload_file(path_or_fileobj=str(path), path_in_repo=name, repo_id=loc.host,
                                   repo_type=loc.repo_type, revision=loc.revision, commit_message=f"kubetune push {path.name}")
    except Exception as e:
        raise _error(e, loc, "upload") from None
    return str(getattr(info, "commit_url", info))


def verify(loc: Location, files: dict[str, Path]) -> None:
    """Check what the repository holds under ``loc``'s path against the local ``files`` (relative name -> path): each
    one there, with its size, and its LFS sha256 or git blob id (what the Hub lists for a file).

    Raises:
        SourceError: a file missing or different, named.
    """
    import hashlib

    prefix = _prefix(loc)
    try:
        listed = {e.path[len(prefix):]: e for e in _api().list_repo_tree(loc.host, path_in_repo=prefix.rstrip("/") or None, recursive=True,
                                                                          revision=loc.revision, repo_type=loc.repo_type)
                  if getattr(e, "size", None) is not None}
    except Exception as e:
        raise _error(e, loc, "list the repository") from None
    for rel, path in files.items():
        entry = listed.get(rel)
        size = path.stat().st_size
        if entry is None or entry.size != size:
            raise SourceError(f"{loc.safe}: verification failed for '{rel}': " + ("missing" if entry is None else f"{entry.size} bytes, expected {size}"))
        lfs = getattr(entry, "lfs", None)
        data = path.read_bytes() if lfs is None else None
        ok = (lfs.sha256 == _sha256(path)) if lfs is not None else entry.blob_id == hashlib.sha1(b"blob %d\0" % size + data).hexdigest()
        if not ok:
            raise SourceError(f"{loc.safe}: verification failed for '{rel}': its checksum differs from the source's")


def _sha256(path: Path) -> str:
    from ._common import file_digest

    return file_digest(path)


class HfTarget:
    """``output.uri: hf://ORG/NAME``: checkpoints and results as commits of one repository (see the module's layout)."""

    def __init__(self, loc: Location) -> None:
        if loc.repo_type != "model":
            raise SourceError(f"{loc.safe}: output.uri on the Hub must be a model repository (hf://ORG/NAME)")
        self.loc = loc
        self.base = _prefix(loc)
        self._made = False

    def _ready(self) -> None:
        if not self._made:
            ensure_repo(self.loc)
            self._made = True

    def _files(self) -> list[str]:
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            return list(_api().list_repo_files(self.loc.host, repo_type="model", revision=self.loc.revision))
        except (RepositoryNotFoundError, RevisionNotFoundError):
            return []
        except Exception as e:
            raise _error(e, self.loc, "list the repository") from None

    def complete_checkpoints(self) -> list[str]:
        """The checkpoints whose completion marker is in the repository, oldest first."""
        root = f"{self.base}{_CHECKPOINTS}/"
        names = {f[len(root):].split("/", 1)[0] for f in self._files() if f.startswith(root) and f.endswith(f"/{C.CHECKPOINT_COMPLETE}")}
        return sorted(names, key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else -1)

    def upload_checkpoint(self, local: Path, name: str) -> None:
        """One commit with the whole checkpoint folder (so its marker is there only with every file)."""
        self._ready()
        try:
            _api().upload_folder(folder_path=str(local), repo_id=self.loc.host, revision=self.loc.revision,
                                 path_in_repo=f"{self.base}{_CHECKPOINTS}/{name}", commit_message=f"kubetune: {name}")
        except Exception as e:
            raise _error(e, self.loc, f"upload {name}") from None

    def download_checkpoint(self, name: str, into: Path) -> None:
        """Download checkpoint ``name`` into the folder ``into``."""
        from huggingface_hub import snapshot_download

        sub = f"{self.base}{_CHECKPOINTS}/{name}"
        try:
            with tempfile.TemporaryDirectory(prefix="kubetune-hf-") as tmp:
                snapshot_download(self.loc.host, revision=self.loc.revision, allow_patterns=[f"{sub}/*"], local_dir=tmp)
                into.mkdir(parents=True, exist_ok=True)
                for path, rel in walk_files(Path(tmp) / sub):
                    (into / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(path), into / rel)
        except SourceError:
            raise
        except Exception as e:
            raise _error(e, self.loc, f"download {name}") from None

    def delete_checkpoint(self, name: str) -> None:
        """Delete checkpoint ``name`` (one commit)."""
        try:
            _api().delete_folder(f"{self.base}{_CHECKPOINTS}/{name}", self.loc.host, revision=self.loc.revision,
                                 commit_message=f"kubetune: remove {name}")
        except Exception as e:
            raise _error(e, self.loc, f"delete {name}") from None

    def publish(self, run_dir: Path) -> None:
        """One commit: the adapter (or full model) at the top, merged/, the model card, kubetune/ (the record)."""
        from huggingface_hub import CommitOperationAdd

        from .sync_targets import _RUN_FILES, _read_json, _redacted_record, _run_facts

        self._ready()
        adapter, model, merged = run_dir / C.ADAPTER_DIR, run_dir / C.MODEL_DIR, run_dir / C.MERGED_DIR
        top = adapter if adapter.is_dir() else model if model.is_dir() else None
        if top is None and not merged.is_dir():
            raise SourceError(f"{run_dir}: no adapter/, model/ or merged/ to publish to {self.loc.safe}")
        ops = [CommitOperationAdd(f"{self.base}{rel}", str(p)) for p, rel in walk_files(top)] if top else []
        if merged.is_dir():
            ops += [CommitOperationAdd(f"{self.base}merged/{rel}", str(p)) for p, rel in walk_files(merged)]
        base_model, method = _run_facts(run_dir)
        ops.append(CommitOperationAdd(f"{self.base}README.md", _card(base_model, method, _read_json(run_dir / C.RESULT_FILE), adapter.is_dir(),
                                                                    merged.is_dir()).encode()))
        with _redacted_record([(run_dir / f, f) for f in _RUN_FILES if (run_dir / f).is_file()]) as record:
            ops += [CommitOperationAdd(f"{self.base}{_RECORD}/{rel}", str(p)) for p, rel in record]
            try:
                _api().create_commit(self.loc.host, ops, revision=self.loc.revision, commit_message=f"kubetune: {method or 'fine-tune'} results")
            except Exception as e:
                raise _error(e, self.loc, "publish the results") from None


def _card(base_model: str, method: str, result: dict, adapter: bool, merged: bool) -> str:
    """A model card: front matter the Hub reads (base model, library, tags), then the run's numbers."""
    hub_base = base_model[len("hf://"):].split("@", 1)[0] if base_model.startswith("hf://") else None
    meta = {"library_name": "peft" if adapter else "transformers", "tags": ["kubetune", *([method] if method else [])],
            **({"base_model": hub_base} if hub_base else {})}
    numbers = {k: result[k] for k in ("train_loss", "eval_loss", "perplexity", "global_step", "tokens", "train_seconds") if k in result}
    import yaml

    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"Fine-tuned with kubetune ({method or 'fine-tune'}) from `{base_model or 'unknown'}`.", ""]
    if adapter:
        lines += ["The adapter is at the top of this repository (`PeftModel.from_pretrained(base, REPO)`)." + (
            " The merged model is in `merged/` (`from_pretrained(REPO, subfolder=\"merged\")`)." if merged else ""), ""]
    if numbers:
        lines += ["| metric | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in numbers.items()], ""]
    lines += ["The run's record (resolved spec, events, result.json) is in `kubetune/`.", ""]
    return "\n".join(lines)
