# syntax=docker/dockerfile:1
#
# Two images from one file:
#
#   docker build --target operator -t dispatch-kubeflow:0.1.0 .
#   docker build --target publish  -t dispatch-publish:0.1.0 .
#
# `operator` runs `dispatch-kubeflow run` (the kopf operator) as a non-root user, with no compiler or
# build tools in the final stage. `publish` carries the publish program at /publish, for the
# TrainJob's image volume (mounted at /opt/dispatch, so the program is /opt/dispatch/publish) or
# for a runtime's init container that copies it into the shared emptyDir:
#
#   initContainers: [{name: dispatch-publish, image: <publish image by digest>,
#                     command: [cp, /publish, /opt/dispatch/publish], ...}]
#
# publish is a dependency-free Python 3 script: the trainer image must have `python3` on PATH to
# run it. Users pin the publish image by digest (`publish.image` in the adapter's settings).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUSYBOX_IMAGE=busybox:1.37-musl

# ---- build: install the package and its dependencies into a virtualenv -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip install . && pip uninstall --yes pip setuptools wheel

# ---- operator: the kopf operator, non-root, read-only-root-filesystem friendly ----------------
FROM ${PYTHON_IMAGE} AS operator
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# No package manager, compiler or pip is needed at run time.
RUN rm -rf /usr/local/lib/python3.11/ensurepip /usr/local/bin/pip*
# A numeric, non-root identity (the chart's runAsUser/runAsGroup); no home directory is needed.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["dispatch-kubeflow", "run"]
CMD ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]

# ---- publish: the publish program, for image volumes and init containers ----------------------
FROM ${BUSYBOX_IMAGE} AS publish
COPY --chmod=0555 operator/dispatch_kubeflow/publish.py /publish
USER 65532:65532
