"""opendecide/extras.py: a missing optional package fails naming the extra that installs it."""

from __future__ import annotations

import pytest

from opendecide.extras import MissingExtra, needs_extra


def test_a_missing_module_of_the_extra_names_the_install_command():
    with pytest.raises(
        MissingExtra, match=r"the local engine needs torch: pip install 'opendecide\[local\]'"
    ):
        with needs_extra("local", "the local engine"):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")


def test_a_submodule_counts_as_its_package():
    with pytest.raises(MissingExtra, match=r"opendecide\[gcs\]") as raised:
        with needs_extra("gcs", "Cloud Storage transfers"):
            raise ModuleNotFoundError("No module named 'google.cloud'", name="google.cloud")
    assert isinstance(raised.value, ModuleNotFoundError) and raised.value.name == "google.cloud"


def test_another_missing_module_is_not_blamed_on_the_extra():
    with pytest.raises(ModuleNotFoundError) as raised:
        with needs_extra("plots", "figures"):
            raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
    assert not isinstance(raised.value, MissingExtra)
