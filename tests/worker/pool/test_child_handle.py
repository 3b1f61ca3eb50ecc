"""What the supervisor hands its training child: only the environment it needs."""

from __future__ import annotations

from amptrain.worker.pool.child_handle import child_env

WORKER_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/scratch",
    "PYTHONPATH": "/plugins",
    "VIRTUAL_ENV": "/venv",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "CUDA_MODULE_LOADING": "LAZY",
    "NCCL_DEBUG": "WARN",
    "OMP_NUM_THREADS": "4",
    "MKL_NUM_THREADS": "4",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_HOME": "/cache/torch",
    "AMPTRAIN_ADMIN_TOKEN": "admin-secret",
    "AMPTRAIN_DATABASE_URL": "postgresql://amptrain:db-secret@db/amptrain",
    "AMPTRAIN_REDIS_URL": "redis://:redis-secret@redis:6379/0",
    "PGPASSWORD": "db-secret",
    "SSH_AUTH_SOCK": "/tmp/agent",
}


def test_the_child_gets_the_allowed_variables_and_its_own_gpu() -> None:
    env = child_env("2", WORKER_ENV)
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    kept = {k for k in WORKER_ENV if k in env}
    assert kept == {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MODULE_LOADING",
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_HOME",
    }
    assert not any("secret" in v for v in env.values())


def test_the_child_never_reaches_the_hugging_face_hub() -> None:
    """Set before the child imports anything, and not undone by an operator's passthrough."""
    env = child_env(None, {**WORKER_ENV, "HF_HUB_OFFLINE": "0"}, passthrough=["HF_*"])
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_without_a_gpu_the_child_sees_what_the_worker_sees() -> None:
    assert child_env(None, {**WORKER_ENV, "CUDA_VISIBLE_DEVICES": ""})["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in child_env(None, {"PATH": "/usr/bin"})


def test_operator_patterns_pass_object_store_credentials_and_nothing_else() -> None:
    env = {**WORKER_ENV, "AWS_SECRET_ACCESS_KEY": "s3-secret", "AWS_REGION": "eu-west-1"}
    passed = child_env(None, env, passthrough=["AWS_*"])
    assert passed["AWS_SECRET_ACCESS_KEY"] == "s3-secret" and passed["AWS_REGION"] == "eu-west-1"
    assert not any(k.startswith("AMPTRAIN_") for k in passed)
    assert "AWS_SECRET_ACCESS_KEY" not in child_env(None, env)


def test_the_default_passthrough_is_the_object_store_credentials() -> None:
    from amptrain.core.settings import Settings

    assert Settings(child_env_passthrough="AWS_*,MY_VAR").child_env_passthrough == [
        "AWS_*",
        "MY_VAR",
    ]
    assert "AWS_*" in Settings().child_env_passthrough
