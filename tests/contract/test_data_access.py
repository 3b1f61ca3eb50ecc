"""Dataset paths checked as text, before anything is opened: protocols, roots, per-user
sub-roots, and refusals that name the problem without showing the roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from amptrain.contract.admission import ServicePolicy, admission_problems
from amptrain.contract.data_access import PathRefused, check_location, parse, user_roots
from amptrain.contract.spec import parse_spec


def _tensors(path: str) -> object:
    return parse_spec(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "tensors", "args": {"path": path}},
            "max_steps": 1,
        }
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("ftp://127.0.0.1:2121/x.csv", "protocol 'ftp' is not allowed here \\(allowed: file\\)"),
        ("http://169.254.169.254/latest/x.csv", "protocol 'http' is not allowed"),
        ("simplecache::ftp://h/x.csv", "chained URLs"),
        ("s3://bucket/x.npz", "protocol 's3' is not allowed"),
        ("../../etc/passwd.csv", "must stay inside the data roots"),
        ("file://relative/x.csv", "must name an absolute path"),
        ("/etc/passwd", "outside the allowed data roots"),
        ("weird/x://y.csv", "not a valid URL"),
    ],
)
def test_refused_paths_name_the_problem_and_not_the_roots(
    tmp_path: Path, path: str, message: str
) -> None:
    root = tmp_path / "secret-root-name"
    with pytest.raises(PathRefused, match=message) as err:
        check_location(path, [str(root)])
    assert "secret-root-name" not in str(err.value) and str(tmp_path) not in str(err.value)


def test_urls_must_match_protocol_and_authority_of_a_root() -> None:
    roots = ["s3://team-bucket/data", "ftp://files.internal:21/shared"]
    protocols = ["file", "s3", "ftp"]
    assert check_location("s3://team-bucket/data/a/x.npz", roots, protocols) == [
        "s3://team-bucket/data/a/x.npz"
    ]
    assert check_location("s3://team-bucket/data/a/../b.npz", roots, protocols) == [
        "s3://team-bucket/data/b.npz"  # what is opened is what was checked
    ]
    for outside in (
        "s3://other-bucket/data/x.npz",
        "s3://team-bucket/database/x.npz",
        "s3://team-bucket/data/../../other/x.npz",
        "ftp://127.0.0.1:21/shared/x.csv",  # another host
        "ftp://files.internal:2121/shared/x.csv",  # another port
        "ftp://user@files.internal:21/shared/x.csv",
    ):
        with pytest.raises(PathRefused, match="outside the allowed data roots"):
            check_location(outside, roots, protocols)
    with pytest.raises(PathRefused, match="must not contain '\\?'"):
        check_location("s3://team-bucket/data/x.npz?versionId=1", roots, protocols)
    with pytest.raises(PathRefused, match="protocol 'gs' is not allowed"):
        check_location("gs://team-bucket/data/x.npz", roots, protocols)


def test_relative_paths_are_looked_up_under_each_local_root(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert check_location("team/x.npz", [str(a), str(b)]) == [
        str(a / "team" / "x.npz"),
        str(b / "team" / "x.npz"),
    ]
    (a / "team").mkdir(parents=True)
    (a / "team" / "escape").symlink_to(tmp_path)
    # Resolved on the worker: a symlink out of the root drops that candidate.
    assert check_location("team/escape/b/x.npz", [str(a)], resolve=False) == [
        str(a / "team" / "escape" / "b" / "x.npz")
    ]
    with pytest.raises(PathRefused, match="outside the allowed data roots"):
        check_location("team/escape/b/x.npz", [str(a)])


def test_per_user_roots(tmp_path: Path) -> None:
    roots = [str(tmp_path / "data"), "s3://bucket/home"]
    assert user_roots(roots, "alice", per_user=False) == roots
    assert user_roots(roots, "alice", per_user=True) == [
        str(tmp_path / "data" / "alice"),
        "s3://bucket/home/alice",
    ]
    for bad in ("..", "a/b", "", ".hidden", "x\x1b", None):
        with pytest.raises(PathRefused, match="cannot name a data directory"):
            user_roots(roots, bad, per_user=True)
    alice = user_roots([str(tmp_path / "data")], "alice", per_user=True)
    assert check_location("x.npz", alice) == [str(tmp_path / "data" / "alice" / "x.npz")]
    for other in ("../bob/x.npz", str(tmp_path / "data" / "bob" / "x.npz")):
        with pytest.raises(PathRefused):
            check_location(other, alice)


def test_parse_never_guesses_a_protocol_from_the_middle_of_a_path() -> None:
    assert parse("data:text/plain,hello.csv") == "data:text/plain,hello.csv"  # a relative file
    loc = parse("FILE:///srv/data/../data/x.npz")
    assert not isinstance(loc, str) and (loc.protocol, loc.path) == ("file", "/srv/data/x.npz")


def test_the_api_refuses_the_same_paths_at_submit(tmp_path: Path) -> None:
    policy = ServicePolicy(data_roots=(str(tmp_path),))
    (problem,) = admission_problems(_tensors("ftp://127.0.0.1:9/x.csv"), "alice", policy)  # type: ignore[arg-type]
    assert problem["loc"] == ["dataset", "args", "path"]
    assert "protocol 'ftp' is not allowed" in problem["msg"]
    assert admission_problems(_tensors("ok/x.npz"), "alice", policy) == []  # type: ignore[arg-type]
    per_user = ServicePolicy(data_roots=(str(tmp_path),), data_roots_per_user=True)
    bob_file = str(tmp_path / "bob" / "x.npz")
    (problem,) = admission_problems(_tensors(bob_file), "alice", per_user)  # type: ignore[arg-type]
    assert "outside the allowed data roots" in problem["msg"]
    assert admission_problems(_tensors(bob_file), "bob", per_user) == []  # type: ignore[arg-type]


REQUIRED_ARGS = {
    "parquet": {"path": "t.parquet"},
    "token-file": {"path": "t.bin", "vocab_size": 256},
    "webdataset": {"pattern": "s-{0..1}.tar"},
    "image-folder": {"path": "photos"},
    "tensors": {"path": "x.npz"},
}


def test_every_path_argument_of_every_file_dataset_is_checked_at_submit(tmp_path: Path) -> None:
    """The path rule holds for each reader: every argument a built-in dataset declares as a
    path is refused at submit when it leaves the data roots, and none is forgotten."""
    from amptrain.contract.catalog import builtins

    policy = ServicePolicy(data_roots=(str(tmp_path),))
    readers = {name: reg for name, reg in builtins("dataset").items() if reg.path_args}
    assert set(readers) == set(REQUIRED_ARGS), sorted(readers)
    for name, reg in readers.items():
        for arg in reg.path_args:
            args = {**REQUIRED_ARGS[name], arg: "../../etc/passwd"}
            spec = parse_spec(
                {"model": {"name": "mlp"}, "dataset": {"name": name, "args": args}, "max_steps": 1}
            )
            problems = admission_problems(spec, "alice", policy)
            assert [p["loc"] for p in problems] == [["dataset", "args", arg]], (name, problems)
            assert "must stay inside the data roots" in problems[0]["msg"]
            assert str(tmp_path) not in problems[0]["msg"]
