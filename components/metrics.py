"""Metrics components: ``metrics.tensorboard``, TorchX's, running the real TensorBoard.

The image (or, on local_cwd and slurm, the environment) needs ``tensorboard``: ``pip install
'xrun[tensorboard]'`` installs the pinned version.
"""

from __future__ import annotations

from xrun.specs import AppDef, Role

from . import DEFAULT_IMAGE


def tensorboard(
    logdir: str,
    image: str = DEFAULT_IMAGE,
    timeout: float = 60 * 60,
    port: int = 6006,
    start_on_file: str = "",
    exit_on_file: str = "",
) -> AppDef:
    """Serve TensorBoard on ``logdir`` until ``timeout`` or until ``exit_on_file`` exists.

    TensorBoard is a service, so it ends on a condition: the timeout, or a file that appears
    (checked every 5 s; fsspec URLs work).

    Args:
        logdir: fsspec path to the TensorBoard logs
        image: image to use (with tensorboard installed)
        timeout: maximum time to run before exiting (seconds)
        port: the port TensorBoard serves on
        start_on_file: start the server when this fsspec path is created
        exit_on_file: shut the server down when this fsspec path is created
    """
    return AppDef(
        name="tensorboard",
        roles=[
            Role(
                name="tensorboard",
                image=image,
                entrypoint="python3",
                args=[
                    "-m",
                    "xrun.components._apps",
                    "monitor",
                    "--timeout",
                    str(timeout),
                    "--start_on_file",
                    start_on_file,
                    "--exit_on_file",
                    exit_on_file,
                    "--",
                    "tensorboard",
                    "--bind_all",
                    "--port",
                    str(port),
                    "--logdir",
                    logdir,
                ],  # fmt: skip
                port_map={"http": port},
            )
        ],
    )
