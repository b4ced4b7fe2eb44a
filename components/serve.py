"""Serving components: ``serve.torchserve``, TorchX's: register a model archive with a running
TorchServe through its management API.

The replica (``python3 -m xrun.components._serve``) copies the archive from any fsspec path
into a private temp dir, serves that dir over HTTP on ``port`` (TorchX's 8222,
``port_map["model-download"]``), and POSTs ``/models?url=...`` (plus the TorchServe parameters
given) to the management API; TorchServe downloads the archive from it. The replica exits 0 when
TorchServe answered 2xx, else 1 with TorchServe's answer on stderr.
"""

from __future__ import annotations

from xrun.specs import AppDef, Resource, Role

from . import DEFAULT_IMAGE

# TorchServe's register-a-model parameters the app passes on (its management API's names).
TORCHSERVE_PARAMS = (
    "model_name",
    "handler",
    "runtime",
    "batch_size",
    "max_batch_delay",
    "initial_workers",
    "synchronous",
    "response_timeout",
)
DOWNLOAD_PORT = 8222


def torchserve(
    model_path: str,
    management_api: str,
    image: str = DEFAULT_IMAGE,
    params: dict[str, str] | None = None,
    dryrun: bool = False,
) -> AppDef:
    """Deploys a model archive to a TorchServe management API (TorchX's serve.torchserve).

    Args:
        model_path: the fsspec path of the model archive (.mar)
        management_api: the URL of TorchServe's management API, e.g. http://torchserve:8081
        image: container image (docker)
        params: TorchServe's register-a-model parameters, e.g. model_name=m,initial_workers=1
        dryrun: start the app but do nothing (prints that it started)
    """
    args = ["-m", "xrun.components._serve", "--model_path", model_path]
    args += ["--management_api", management_api]
    for key, value in (params or {}).items():
        args += [f"--{key}", str(value)]
    if dryrun:
        args.append("--dryrun")
    return AppDef(
        name="torchx-torchserve",
        roles=[
            Role(
                name="worker",
                image=image,
                entrypoint="python3",
                args=args,
                port_map={"model-download": DOWNLOAD_PORT},
                resource=Resource(cpu=1, gpu=0, memMB=1024),
            )
        ],
    )
