"""`gpusandbox oci features`: what it announces is what create honours."""
import io
import json
from contextlib import redirect_stdout

from gpusandbox.oci.runtime import ops


def _doc():
    buf = io.StringIO()
    with redirect_stdout(buf):
        out = ops.features()
    text = buf.getvalue() or (out if isinstance(out, str) else json.dumps(out))
    return json.loads(text)


def test_every_hook_stage_the_runtime_runs_is_announced():
    # createContainer and startContainer are run by the container's init
    # (stages/ocisetup.py), the others by create, start and delete.
    assert _doc()["hooks"] == ["prestart", "createRuntime", "createContainer",
                               "startContainer", "poststart", "poststop"]
