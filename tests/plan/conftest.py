import pytest


@pytest.fixture(scope="session")
def synthetic_kda(tmp_path_factory):
    from trtllm_dasc.plan.synthetic import write_checkpoint
    return write_checkpoint(str(tmp_path_factory.mktemp("syn") / "kda"), "kda", seed=0, shards=3)


@pytest.fixture(scope="session")
def synthetic_gdn(tmp_path_factory):
    from trtllm_dasc.plan.synthetic import write_checkpoint
    return write_checkpoint(str(tmp_path_factory.mktemp("syn") / "gdn"), "gdn", seed=0, shards=2)

