"""Fixtures of the Slurm tests: the Slurm installations real clusters run on."""
from __future__ import annotations

import pytest

from slurm_installs import install_id, installs


@pytest.fixture(scope="module", params=installs(), ids=install_id)
def slurm_install(request):
    """Each Slurm the real-cluster tests run on: the host's (22.05) and the chroot's (24.11)."""
    reason = request.param.skip_reason()
    if reason:
        pytest.skip(reason)
    return request.param
