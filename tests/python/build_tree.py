"""What the Python tests share: the tierswap CLI of the build tree the package came from."""
import os

import pytest


def cli_path():
    """The tierswap CLI beside the imported package's build tree (else the calling test skips)."""
    import tierswap
    cli = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(tierswap.__file__))),
                       "tierswap")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no tierswap CLI beside the package ({cli}): not a build tree")
    return cli
