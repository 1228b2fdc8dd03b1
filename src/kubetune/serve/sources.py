"""What ``kubetune serve SOURCE --adapter NAME=URI`` serves: local directories and the ids clients send.

SOURCE is a run directory (its merged/ or model/, else its base model plus adapter/), a model
directory, or a model URI (fetched; a fetched run layout, e.g. an ``output.uri`` prefix on S3, is read
like a run directory). Every ``--adapter`` is a run directory, an adapter directory or a URI of one.
Both engines read the same :class:`ServePlan`.

A plan holds URIs only with their credentials masked (:func:`kubetune.redact.redact_uri`): they are shown in
``/v1/models`` (``root``), ids, ``/metrics`` labels and logs. The real URI is used once, to fetch.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .. import constants as C
from ..errors import SourceError, SpecError
from ..redact import redact_uri
from .options import check_model_name

__all__ = ["ServePlan", "ServedAdapter", "resolve_sources", "model_name_from_uri"]

log = logging.getLogger("kubetune.serve")


@dataclass(frozen=True)
class ServedAdapter:
    """A LoRA adapter served next to the base model.

    Attributes:
        name: the id clients send as ``model``.
        path: the local adapter directory (adapter_config.json, adapter weights).
        uri: what the user named (credentials masked).
        base_model: the base model URI the adapter was trained on, when a run records it (credentials masked).
        rank: the adapter's LoRA rank (vLLM needs the largest one up front).
        peft_type: PEFT's adapter type (LORA, ...).
        use_dora: a DoRA adapter (LoRA type, weight-decomposed).
        modules_to_save: modules trained fully and stored in the adapter (PEFT's modules_to_save).
    """

    name: str
    path: Path
    uri: str
    base_model: str | None = None
    rank: int | None = None
    peft_type: str | None = None
    use_dora: bool = False
    modules_to_save: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServePlan:
    """Everything an engine needs to load, and the names it answers to.

    Attributes:
        source: SOURCE as the user gave it (credentials masked).
        model_dir: the model loaded into memory (a base, full fine-tune or merged model).
        model_name: the id of ``model_dir`` itself (no adapter).
        adapters: adapters served on top of ``model_dir``, in the order given (a LoRA run's own first).
        default_model: the id listed first (a LoRA run's adapter, else ``model_name``).
        base_uri: the model URI ``model_dir`` came from, when known (credentials masked).
        trust_remote_code: the run's ``model.trust_remote_code``.
    """

    source: str
    model_dir: Path
    model_name: str
    adapters: tuple[ServedAdapter, ...] = ()
    default_model: str = ""
    base_uri: str | None = None
    trust_remote_code: bool = False

    @property
    def model_ids(self) -> list[str]:
        """Every id clients may send, the default first."""
        ids = [self.default_model] + [self.model_name] + [a.name for a in self.adapters]
        return list(dict.fromkeys(ids))

    def adapter_for(self, model_id: str) -> ServedAdapter | None:
        """The adapter serving ``model_id`` (None: the model itself)."""
        return next((a for a in self.adapters if a.name == model_id), None)


def resolve_sources(source: str | os.PathLike, adapters: dict[str, str] | None = None, *, served_model_name: str | None = None) -> ServePlan:
    """Find the model and adapter directories to serve (fetching URIs), and name them.

    Args:
        source: a run directory, a model directory or a model URI.
        adapters: NAME -> URI of extra LoRA adapters (run directories, adapter directories or URIs).
        served_model_name: the id of the main model (default: the run's name, or the model's).

    Returns:
        The :class:`ServePlan`.

    Raises:
        SourceError: nothing servable at ``source`` or at an adapter URI.
        SpecError: two models would get the same name.
    """
    plan = _resolve_main(str(source), served_model_name)
    extra = []
    for name, uri in (adapters or {}).items():
        extra.append(_resolve_adapter(name, uri))
    _refuse_stacking_on_merged(plan, extra)
    plan = ServePlan(**{**plan.__dict__, "adapters": plan.adapters + tuple(extra), "source": redact_uri(plan.source),
                        "base_uri": redact_uri(plan.base_uri) if plan.base_uri else None})
    _check_names(plan)
    for a in plan.adapters:
        if a.base_model and plan.base_uri and a.base_model != plan.base_uri:
            log.warning("adapter %s was trained on %s but the served base model is %s", a.name, a.base_model, plan.base_uri)
    return plan


def model_name_from_uri(uri: str) -> str:
    """A readable model id for a URI or path: builtin://tiny-chat -> tiny-chat, hf://org/name@rev -> org/name.

    Never from a credential: the user-info, query and fragment of a URI are left out
    (https://user:pass@host/m.tar.gz?token=... -> m).
    """
    text = uri.rstrip("/")
    if "://" in text:
        scheme, rest = text.split("://", 1)
        rest = rest.split("?", 1)[0].split("#", 1)[0]
        authority, slash, path = rest.partition("/")
        rest = authority.rpartition("@")[2] + slash + path  # hf's @revision is in the path, not the authority
        if scheme == "hf":
            return rest.split("@", 1)[0]
        text = rest.rstrip("/")
    name = text.rsplit("/", 1)[-1] or "model"
    for suffix in (".tar.gz", ".tgz", ".tar", ".zip"):
        name = name.removesuffix(suffix)
    return name.replace("=", "-").replace(" ", "-") or "model"


# --- SOURCE ------------------------------------------------------------------------------------
def _resolve_main(source: str, served: str | None) -> ServePlan:
    path = Path(source).expanduser()
    if not path.exists():
        if "://" not in source:
            raise SourceError(f"{source}: no such run directory, model directory or URI", hint="pass a run directory (runs/NAME), a model directory, or a URI such as hf://org/name")
        from ..storage import fetch

        path = fetch(source)
    if (path / C.SPEC_FILE).is_file():
        return _from_run(source, path, served)
    if (path / "config.json").is_file():
        return _plan(source, path, served or model_name_from_uri(source), base_uri=source if "://" in source else None)
    if (path / "adapter_config.json").is_file():
        raise SourceError(
            f"{source}: this is an adapter, not a model",
            hint="serve its base model and add the adapter: kubetune serve BASE --adapter NAME=" + source,
        )
    raise SourceError(f"{source}: not a run directory (no {C.SPEC_FILE}) or a model directory (no config.json)")


def _from_run(source: str, run: Path, served: str | None) -> ServePlan:
    from ..spec import load_spec

    job = load_spec(run / C.SPEC_FILE)
    if job.entrypoint is not None:
        raise SourceError(f"{source}: the run ran a custom training function ({job.entrypoint.describe()}); kubetune does not "
                          "know which model it saved", hint="serve the model directory your function saved (a folder with config.json), e.g. kubetune serve RUN/model")
    name = served or job.name
    for sub in (C.MERGED_DIR, C.MODEL_DIR):
        if (run / sub / "config.json").is_file():
            return _plan(source, run / sub, name, trust=job.model.trust_remote_code)
    if not (run / C.ADAPTER_DIR / "adapter_config.json").is_file():
        raise SourceError(
            f"{source}: the run has no trained model yet (no {C.MERGED_DIR}/, {C.MODEL_DIR}/ or {C.ADAPTER_DIR}/)",
            hint="kubetune status shows whether it finished",
        )
    from ..redact import is_redacted
    from ..storage import fetch

    if is_redacted(job.model.source):  # spec.yaml keeps no credentials: the base model's URI needs them from the user
        raise SourceError(
            f"{source}: the run's base model {job.model.source} needs credentials, which kubetune never saves in a run",
            hint=f"serve the base model with its credentials and add the run's adapter: kubetune serve BASE_URI --adapter {name}={source}",
        )
    base_dir = fetch(job.model.pinned_source)
    adapter = _adapter(name, run / C.ADAPTER_DIR, source, base_model=job.model.source)
    return ServePlan(
        source=source,
        model_dir=base_dir,
        model_name=model_name_from_uri(job.model.source),
        adapters=(adapter,),
        default_model=name,
        base_uri=job.model.source,
        trust_remote_code=job.model.trust_remote_code,
    )


def _refuse_stacking_on_merged(plan: ServePlan, extra: list[ServedAdapter]) -> None:
    """A run directory serves its merged/ model: base model + the run's adapter. An --adapter trained on the base
    model would silently act on that merged model instead (the run's adapter applied twice, or two adapters
    mixed); only one trained on merged/ itself belongs there.

    Raises:
        SpecError: such an adapter, naming it and what to serve instead.
    """
    run = plan.model_dir.parent
    if not extra or plan.model_dir.name != C.MERGED_DIR or not (run / C.SPEC_FILE).is_file():
        return
    merged = plan.model_dir.resolve()
    if "://" not in plan.source and Path(plan.source).expanduser().resolve() == merged:
        return  # merged/ named on purpose: a model directory like any other
    from ..spec import load_spec

    base = load_spec(run / C.SPEC_FILE).model.source
    for a in extra:
        on_merged = a.base_model is not None and "://" not in a.base_model and Path(a.base_model).expanduser().resolve() == merged
        if not on_merged:
            trained_on = f"trained on {a.base_model}" if a.base_model else "whose base model is not recorded"
            raise SpecError(
                f"--adapter {a.name}={a.uri}: {plan.source} serves its merged model ({plan.model_dir}: the base model with "
                f"the run's adapter merged in), and this adapter ({trained_on}) would be stacked on top of it",
                hint=f"serve the base model with both adapters on it: kubetune serve {base} --adapter {plan.model_name}="
                f"{plan.source} --adapter {a.name}={a.uri}; or, to stack it on the merged model on purpose, name that "
                f"directory: kubetune serve {plan.model_dir} --adapter {a.name}={a.uri}",
            )


def _plan(source: str, model_dir: Path, name: str, *, trust: bool = False, base_uri: str | None = None) -> ServePlan:
    return ServePlan(source=source, model_dir=model_dir, model_name=name, default_model=name, base_uri=base_uri, trust_remote_code=trust)


# --- --adapter NAME=URI --------------------------------------------------------------------------
def _resolve_adapter(name: str, uri: str) -> ServedAdapter:
    path = Path(uri).expanduser()
    if not path.exists():
        if "://" not in uri:
            raise SourceError(f"--adapter {name}={uri}: no such directory", hint="pass a run directory, an adapter directory or a URI (s3://, oci://, hf://)")
        from ..storage import fetch

        path = fetch(uri)
    base_model = None
    if (path / C.SPEC_FILE).is_file() and (path / C.ADAPTER_DIR).is_dir():
        from ..spec import load_spec

        base_model = load_spec(path / C.SPEC_FILE).model.source
    if (path / C.ADAPTER_DIR / "adapter_config.json").is_file():
        path = path / C.ADAPTER_DIR
    if not (path / "adapter_config.json").is_file():
        hint = "a full fine-tune or merged model is served on its own: kubetune serve " + uri if (path / "config.json").is_file() else None
        raise SourceError(f"--adapter {name}={uri}: no LoRA adapter there (no adapter_config.json)", hint=hint)
    return _adapter(name, path, uri, base_model=base_model)


def _adapter(name: str, path: Path, uri: str, *, base_model: str | None) -> ServedAdapter:
    try:
        cfg = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SourceError(f"{path / 'adapter_config.json'}: cannot read it ({e})") from None
    rank = cfg.get("r")
    return ServedAdapter(
        name=check_model_name(name, "adapter name"),
        path=path,
        uri=redact_uri(uri),
        base_model=redact_uri(base_model) if base_model else base_model,
        rank=int(rank) if isinstance(rank, int) else None,
        peft_type=cfg.get("peft_type"),
        use_dora=bool(cfg.get("use_dora")),
        modules_to_save=tuple(cfg.get("modules_to_save") or ()),
    )


def _check_names(plan: ServePlan) -> None:
    check_model_name(plan.model_name)
    seen = {plan.model_name: "the served model"}
    for a in plan.adapters:
        if a.name in seen:
            raise SpecError(
                f"model name '{a.name}' is used twice ({seen[a.name]} and adapter {a.uri})",
                hint="give the adapter another name (--adapter OTHER=URI) or rename the model (--served-model-name)",
            )
        seen[a.name] = f"adapter {a.uri}"
