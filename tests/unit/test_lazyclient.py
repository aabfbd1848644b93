"""kubernetes_asyncio's client imported name by name: fewer modules, the same names.

Each test runs a fresh interpreter: this one has imported kubernetes_asyncio already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from dispatch_kubeflow.kube.lazyclient import exports

DEFER = "from dispatch_kubeflow.kube.lazyclient import defer_client_imports\n"

LOADED = """
import json, sys
def loaded(prefix):
    return sorted(m for m in sys.modules if m.startswith(prefix))
"""

EVERY_EXPORT = """
import importlib, json
from pathlib import Path
from dispatch_kubeflow.kube.lazyclient import exports
import kubernetes_asyncio
root = Path(kubernetes_asyncio.__file__).parent
names = {}
for package in ("client", "client.api", "client.models"):
    module = importlib.import_module("kubernetes_asyncio." + package)
    init = root.joinpath(*package.split(".")) / "__init__.py"
    for name in exports(init.read_text()):
        value = getattr(module, name)
        names[package + "." + name] = value.__module__ + "." + value.__qualname__
print(json.dumps(names))
"""


def run_python(*parts: str) -> Any:
    """Run the parts of a program in a fresh interpreter and decode the JSON it prints last."""
    source = "\n".join(textwrap.dedent(part) for part in parts)
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_exports_reads_each_name_and_the_module_it_comes_from() -> None:
    source = textwrap.dedent("""
        __version__ = "36.1.0"
        from kubernetes_asyncio.client.api.core_v1_api import CoreV1Api
        from kubernetes_asyncio.client.models.v1_pod import V1Pod
        # from kubernetes_asyncio.client.models.v1_node import V1Node
        from kubernetes_asyncio.client import rest
    """)
    assert exports(source) == {
        "CoreV1Api": "kubernetes_asyncio.client.api.core_v1_api",
        "V1Pod": "kubernetes_asyncio.client.models.v1_pod",
        "rest": "kubernetes_asyncio.client",
    }


def test_the_programs_modules_load_only_the_client_code_they_use() -> None:
    loaded = run_python(
        DEFER,
        LOADED,
        """
        assert defer_client_imports()
        import dispatch_kubeflow.handlers, dispatch_kubeflow.admission.controller, kopf
        from kubernetes_asyncio import client
        client.CoreV1Api, client.CustomObjectsApi, client.CoordinationV1Api
        print(json.dumps([loaded("kubernetes_asyncio.client.api."),
                          loaded("kubernetes_asyncio.client.models.")]))
        """,
    )
    apis, models = loaded
    assert apis == [
        "kubernetes_asyncio.client.api.coordination_v1_api",
        "kubernetes_asyncio.client.api.core_v1_api",
        "kubernetes_asyncio.client.api.custom_objects_api",
    ]
    # kopf's V1ObjectMeta and V1OwnerReference, and what those two refer to.
    assert 0 < len(models) < 20, models


def test_every_name_the_client_exports_is_the_one_the_whole_import_gives() -> None:
    whole = run_python(EVERY_EXPORT)
    deferred = run_python(DEFER, "assert defer_client_imports()", EVERY_EXPORT)
    assert len(whole) > 800
    assert deferred == whole


def test_from_import_star_dir_and_version_read_as_the_whole_package() -> None:
    read = run_python(
        DEFER,
        """
        import json
        assert defer_client_imports()
        import kubernetes_asyncio
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client import api, rest
        namespace = {}
        exec("from kubernetes_asyncio.client.models import *", namespace)
        print(json.dumps({
            "same": kubernetes_asyncio.client is client and client.api is api,
            "rest": rest.__name__,
            "version": client.__version__,
            "star": "V1Pod" in namespace and "V1Node" in namespace,
            "dir": "V1Pod" in dir(client.models),
        }))
        """,
    )
    assert read == {
        "same": True,
        "rest": "kubernetes_asyncio.client.rest",
        "version": read["version"],
        "star": True,
        "dir": True,
    }
    assert read["version"].count(".") == 2


def test_a_response_deserialises_into_the_model_its_type_names() -> None:
    owner = run_python(
        DEFER,
        """
        import asyncio, json
        assert defer_client_imports()
        from kubernetes_asyncio import client

        class Response:
            data = json.dumps({"metadata": {"name": "p", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u"}]}})

        async def read():
            async with client.ApiClient() as api:
                pod = api.deserialize(Response(), "V1Pod")
            reference = pod.metadata.owner_references[0]
            return [type(pod).__name__, type(reference).__name__, reference.kind]

        print(json.dumps(asyncio.run(read())))
        """,
    )
    assert owner == ["V1Pod", "V1OwnerReference", "Node"]


def test_a_name_the_client_lacks_is_refused_as_the_whole_package_refuses_it() -> None:
    refused = run_python(
        DEFER,
        """
        import json
        assert defer_client_imports()
        from kubernetes_asyncio import client
        try:
            client.V1NoSuchThing
        except AttributeError as exc:
            attribute = str(exc)
        try:
            from kubernetes_asyncio.client import V1NoSuchThing
        except ImportError as exc:
            imported = type(exc).__name__
        print(json.dumps([attribute, imported]))
        """,
    )
    assert refused == [
        "module 'kubernetes_asyncio.client' has no attribute 'V1NoSuchThing'",
        "ImportError",
    ]


def test_a_process_that_imported_kubernetes_asyncio_keeps_it_whole() -> None:
    kept = run_python(
        DEFER,
        LOADED,
        """
        import kubernetes_asyncio
        models = len(loaded("kubernetes_asyncio.client.models."))
        print(json.dumps([defer_client_imports(), models]))
        """,
    )
    deferred, models = kept
    assert deferred is False
    assert models > 700


def test_the_command_line_defers_the_client_before_its_command_runs() -> None:
    loaded = run_python(
        LOADED,
        """
        import contextlib, io
        from dispatch_kubeflow import cli
        # Building the parser imports the operator's handlers, and so kopf.
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            cli.main(["run", "--help"])
        print(json.dumps([len(loaded("kopf")), len(loaded("kubernetes_asyncio.client.models."))]))
        """,
    )
    kopf, models = loaded
    assert kopf > 0
    assert 0 < models < 20
