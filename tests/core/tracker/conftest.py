"""Fixtures shared by the tracker backends' tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def mlflow_sqlite(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``sqlite:///DB#EXPERIMENT``: an MLflow tracking store in a tmp dir (no server), the
    experiment's artifacts under the same dir. One per test module (one module's runs are no
    other's), not per test: a fresh store runs MLflow's migrations first, tens of seconds on a
    loaded machine."""
    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).create_experiment("xrun-tests", artifact_location=(d / "artifacts").as_uri())
    return f"{uri}#xrun-tests"
