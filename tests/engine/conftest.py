import pytest

from engine_helpers import build


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> (checkpoint dir, transformers model), built once."""
    out = {}
    for i, arch in enumerate(("gdn", "kda")):
        path = tmp_path_factory.mktemp(f"engine-{arch}")
        out[arch] = (path, build(path, arch, seed=10 + i))
    return out
