"""``python -m dispatch_kubeflow.admission``: the same as ``dispatch-kubeflow admission``.

The chart's Deployment runs the controller this way.
"""

import sys

from dispatch_kubeflow.cli import main

sys.exit(main(["admission", *sys.argv[1:]]))
