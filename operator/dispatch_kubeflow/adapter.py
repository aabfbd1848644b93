"""The adapter: dispatch jobs in, Kubeflow Trainer TrainJobs out (SPEC §3).

``Adapter.open`` parses the settings, connects and runs the preflight probe, so that an adapter
that opened is one that can start a job. ``start``, ``stop_job``, ``find``, ``readmit``,
``reject`` and ``watch`` are what a dispatcher calls; the operator's handlers call the same.

This module is the facade: each operation lives in its own module (``probe``, ``starting``,
``stopping``, ``finding``, ``gate``; ``supervisor`` for ``watch``), working in the adapter's
``Scope``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, SkipValidation

from dispatch_kubeflow import finding, gate, starting, stopping
from dispatch_kubeflow.errors import DispatchError, InvalidError
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.finding import AttemptFound, Found
from dispatch_kubeflow.kube.connection import ApiClientWithTimeouts, connect
from dispatch_kubeflow.probe import preflight_probe
from dispatch_kubeflow.reporting import ReportStore
from dispatch_kubeflow.scope import Scope
from dispatch_kubeflow.settings import Declarations, Settings, parse_settings
from dispatch_kubeflow.settings.names import is_label_value
from dispatch_kubeflow.supervisor import Supervisor
from dispatch_kubeflow.trainjob import JobRef, JobSpec

__all__ = ["Adapter", "AdapterConfig", "AttemptFound", "Found"]


class AdapterConfig(BaseModel):
    """What ``Adapter.open`` needs: the settings (a model or the JSON text) and who we are.

    ``store`` keeps how far each (job, attempt) has been reported, so that ``watch()`` reports
    each transition once across restarts. None keeps it in an annotation on the TrainJob, which
    needs nothing beside the TrainJob; the operator keeps it in the DispatchJob status instead.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    settings: Settings | str | bytes
    token: str | None = None
    # The value of the adapter label on everything this adapter creates.
    adapter_name: str = "default"
    # Any object with the ReportStore methods (a Protocol, so not checked by pydantic).
    store: Annotated[ReportStore | None, SkipValidation] = None


class Adapter:
    """One adapter instance: one namespace, one connection, one set of settings."""

    def __init__(
        self,
        settings: Settings,
        api: ApiClientWithTimeouts,
        adapter_name: str,
        store: ReportStore | None = None,
    ) -> None:
        self.scope = Scope(settings, api, adapter_name)
        self.supervisor = Supervisor(api, settings, adapter_name, store=store)

    @property
    def settings(self) -> Settings:
        return self.scope.settings

    @property
    def api(self) -> ApiClientWithTimeouts:
        return self.scope.api

    @property
    def adapter_name(self) -> str:
        return self.scope.adapter_name

    @classmethod
    async def open(cls, config: AdapterConfig) -> Adapter:
        """Parse, connect, probe. ``ErrInvalid`` for bad settings, ``ErrUnsupported`` else."""
        settings = _settings_of(config.settings)
        _check_adapter_name(config.adapter_name)
        api = await connect(
            settings.cluster, token=config.token, request_timeout=settings.timeouts.request
        )
        adapter = cls(settings, api, config.adapter_name, config.store)
        try:
            await preflight_probe(adapter.scope)
        except BaseException:
            await adapter.close()
            raise
        return adapter

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def declarations(self) -> Declarations:
        return self.settings.declarations()

    @property
    def readmission_gate(self) -> Literal["yes", "no"]:
        return self.settings.readmission_gate

    async def start(self, job: JobSpec) -> JobRef:
        """Create the TrainJob of ``job`` (idempotently), and in Kueue mode see its Workload."""
        return await starting.start(
            self.scope, job, workloads=self.supervisor, runtimes=self.supervisor
        )

    async def stop_job(self, job_id: str) -> None:
        """Delete every TrainJob of the job and wait, up to ``timeouts.stopJob``, for all to go."""
        finding.check_job_id(job_id)
        await stopping.stop_job(
            self.scope, self.supervisor, job_id, self.settings.timeouts.stop_job
        )

    async def find(self, job_id: str) -> Found:
        """Everything of the job read back, with state and cause; ``ErrNotFound`` for nothing."""
        return await finding.find(self.scope, job_id, self.supervisor.trainjob_uids(job_id))

    async def readmit(self, job_id: str) -> None:
        """Open the readmission gate of the job's current TrainJob for its latest eviction."""
        await gate.readmit(self.scope, job_id)

    async def reject(self, job_id: str, reason: str) -> None:
        """Make the job's admission check ``Rejected`` with ``reason``."""
        await gate.reject(self.scope, job_id, reason)

    def watch(self) -> AsyncGenerator[DispatchEvent, None]:
        """Every dispatch event of this adapter: one watch per kind, each transition once."""
        return self.supervisor.events()

    def watch_problems(self) -> list[DispatchError]:
        """Why a watched kind cannot be listed (a 403 names the verb and resource); empty if
        every kind can. Nothing is reported while one cannot, so this says what holds it."""
        return self.supervisor.watch_problems()


def _settings_of(value: Settings | str | bytes) -> Settings:
    if isinstance(value, Settings):
        return value
    return parse_settings(value)


def _check_adapter_name(name: str) -> None:
    if not name or not is_label_value(name):
        raise InvalidError(
            f"adapter name {name!r} is not a label value (at most 63 letters, digits, '-', '_' "
            "or '.', beginning and ending with a letter or digit)"
        )
