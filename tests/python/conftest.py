import json
import os

import pytest


@pytest.fixture
def error_ledger(request):
    """record(quantity, error, tolerance): one JSON line per measured error, in the
    file named by CUFLASH_PY_ERROR_LOG (scripts/gpu-python.sh reports them)."""
    path = os.environ.get("CUFLASH_PY_ERROR_LOG")

    def record(quantity, error, tolerance):
        if path:
            with open(path, "a") as log:
                log.write(json.dumps({"test": request.node.nodeid, "quantity": quantity, "error": float(error),
                                      "tolerance": float(tolerance)}) + "\n")

    return record
