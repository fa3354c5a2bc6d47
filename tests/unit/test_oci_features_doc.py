"""`gpusandbox-oci features` and `version` (issue 25): one spec version for
both (runc's pair), the runtime's own version string in the annotations, and
what the document lists is what config.py takes."""
import json

from gpusandbox import __version__
from gpusandbox.oci import config
from gpusandbox.oci.runtime import cli, ops


def test_features_and_version_agree(capsys):
    assert cli.main(["features"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ociVersionMax"] == ops.SPEC_VERSION
    assert doc["annotations"] == {"io.gpusandbox.version": __version__}
    assert sorted(doc["linux"]["namespaces"]) == sorted(config.NS_FLAGS)
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"gpusandbox-oci version {__version__}", f"spec: {ops.SPEC_VERSION}"]
