"""Paths in a config checked as they will be used: absolute, no NUL, directories that are
directories, site programs not relative, secrets not open to others."""
from __future__ import annotations

import os
from typing import Any, List, Mapping, Tuple

from .checks import ConfigProblem, file_mode_problems, format_path, host_template_problem, problem


def absolute_path(path: str, parts: Tuple[Any, ...], problems: List[ConfigProblem]) -> str:
    """``path`` itself; a relative path is a problem (hooks run with cwd hooks/tmp)."""
    if "\0" in path:
        problems.append(problem(parts, "%s contains a NUL byte, which no path can hold"
                                % format_path(parts)))
    elif path and not os.path.isabs(path):
        problems.append(problem(parts, "%s must be an absolute path, got %r"
                                % (format_path(parts), path)))
    return path


def state_dir_path(path: str, problems: List[ConfigProblem]) -> str:
    """An absolute ``state_dir`` that is a directory if it exists (it is created otherwise)."""
    absolute_path(path, ("state_dir",), problems)
    if "\0" not in path and os.path.exists(path) and not os.path.isdir(path):
        problems.append(problem(("state_dir",), "state_dir %s exists and is not a directory"
                                % path))
    return path


def usable_files(options: Mapping[str, Any], parts: Tuple[Any, ...],
                  problems: List[ConfigProblem]) -> None:
    """A backend's program and credentials as they will be used: the program by absolute
    path or bare name (a relative path would be taken from the hook's working directory),
    the credentials file absolute and not open to group or others."""
    argv = options.get("argv")
    program = argv[0] if isinstance(argv, list) and argv and isinstance(argv[0], str) else ""
    if "/" in program and not os.path.isabs(program):
        problems.append(problem(parts + ("argv", 0), (
            "%s is a relative path, %r: hooks run in server_priv/hooks/tmp, so give the "
            "program's absolute path (or a bare name found on PATH)"
            % (format_path(parts + ("argv", 0)), program))))
    template = options.get("url_template")
    if isinstance(template, str):
        why = host_template_problem(template)
        if why is not None:
            where = parts + ("url_template",)
            problems.append(problem(where, "%s: %s" % (format_path(where), why)))
    creds = options.get("credentials_file")
    if isinstance(creds, str) and creds:
        where = parts + ("credentials_file",)
        absolute_path(creds, where, problems)
        problems.extend(problem(where, msg)
                        for msg in file_mode_problems(creds, format_path(where)))
