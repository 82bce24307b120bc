"""The git trigger's pure parts: glob matching on repository paths, and repository ids from remote URLs."""

from __future__ import annotations

import pytest

from service.gitrepo import glob_match, repo_id_of_url


@pytest.mark.parametrize(
    ("path", "pattern", "expected"),
    [
        ("tasks/a.yml", "tasks/**/*.yml", True),  # ** matches zero segments
        ("tasks/x/a.yml", "tasks/**/*.yml", True),
        ("tasks/x/y/z/a.yml", "tasks/**/*.yml", True),
        ("tasks/a.yaml", "tasks/**/*.yml", False),
        ("tasks.yml", "tasks/**/*.yml", False),
        ("other/tasks/a.yml", "tasks/**/*.yml", False),  # anchored at the repository's root
        ("tasks/x/a.yml", "tasks/*.yml", False),  # * never crosses /
        ("tasks/a.yml", "tasks/*.yml", True),
        ("tasks/x/a.yml", "tasks/*/a.yml", True),
        ("a.yml", "**/*.yml", True),
        ("deep/er/a.yml", "**/*.yml", True),
        ("tasks/x/ds/a.yml", "tasks/**/ds/*.yml", True),
        ("tasks/ds/a.yml", "tasks/**/ds/*.yml", True),
        ("tasks/dsx/a.yml", "tasks/**/ds/*.yml", False),
        ("tasks/a/b/c", "tasks/**", True),
        ("tasks", "tasks/**", True),
        ("tasks/A.yml", "tasks/*.yml", True),
        ("Tasks/a.yml", "tasks/*.yml", False),  # case-sensitive, like git
        ("tasks/a1.yml", "tasks/a[0-9].yml", True),
        ("tasks/ab.yml", "tasks/a?.yml", True),
        ("tasks/x/a.yml", "tasks/**/**/*.yml", True),
        ("tasks/a.yml", "/tasks/*.yml", True),  # a leading / only anchors, as it is anyway
    ],
)
def test_glob_match(path: str, pattern: str, expected: bool) -> None:
    assert glob_match(path, pattern) is expected


def test_glob_match_many_stars_stays_fast() -> None:
    path = "/".join(["d"] * 40) + "/x.txt"
    assert not glob_match(path, "**/a/**/b/**/c/**/*.yml")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/o/r.git", "github.com/o/r"),
        ("https://github.com/o/r", "github.com/o/r"),
        ("git@github.com:o/r.git", "github.com/o/r"),
        ("ssh://git@GitHub.com:22/o/r.git", "github.com/o/r"),
        ("https://user:ghp_secret123@github.com/o/r.git", "github.com/o/r"),
        ("https://x-access-token:tok@github.com/o/r", "github.com/o/r"),
    ],
)
def test_repo_id_of_url_drops_scheme_user_and_credentials(url: str, expected: str) -> None:
    assert repo_id_of_url(url) == expected
    assert "secret" not in repo_id_of_url(url) and "tok" not in repo_id_of_url(url)


def test_repo_id_of_a_local_path_is_absolute() -> None:
    assert repo_id_of_url("/srv/repos/tasks.git") == "/srv/repos/tasks.git"
