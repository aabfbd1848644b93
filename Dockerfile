# syntax=docker/dockerfile:1
#
# Two images from one file:
#
#   docker build --target operator -t dispatch-kubeflow:0.1.0 .
#   docker build --target publish  -t dispatch-publish:0.1.0 .
#
# `operator` runs `dispatch-kubeflow run` (the kopf operator) as a non-root user, with no compiler,
# pip or build tools in the final stage. `publish` carries the publish program at /publish, for the
# TrainJob's image volume (mounted at /opt/dispatch, so the program is /opt/dispatch/publish) or
# for a runtime's init container that copies it into the shared emptyDir:
#
#   initContainers: [{name: dispatch-publish, image: <publish image by digest>,
#                     command: [cp, /publish, /opt/dispatch/publish], ...}]
#
# publish is a dependency-free Python 3 script: the trainer image must have `python3` on PATH to
# run it. Users pin the publish image by digest (`publish.image` in the adapter's settings).
#
# What the operator image installs is pinned: requirements.lock (the package's dependencies) and
# requirements-build.lock (the tools that build the package's own wheel), each with hashes.
#
# BASE is any image with `python3`; BUILD_BASE (BASE unless given) the same Python with its `venv`
# module and ensurepip, for the build stage; BUSYBOX_IMAGE any image with `cp`. python -m tests.images build builds both targets from local bases (made with debootstrap)
# and a wheelhouse of the locked wheels, passing PIP_OPTIONS="--no-index --find-links=/wheels".

ARG BASE=python:3.11-slim-bookworm
ARG BUILD_BASE=${BASE}
ARG BUSYBOX_IMAGE=busybox:1.37-musl

# ---- build: the package and its locked dependencies in a virtualenv ---------------------------
FROM ${BUILD_BASE} AS build
ARG PIP_OPTIONS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
# The build tools get a virtualenv of their own, so the image's has nothing but the package and
# its dependencies (not even pip): pip installs into it from outside with --python.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install ${PIP_OPTIONS} --require-hashes --no-deps -r requirements-build.lock \
 && python3 -m venv --without-pip /opt/venv \
 && /opt/build/bin/pip --python /opt/venv/bin/python install ${PIP_OPTIONS} \
      --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY operator/ operator/
# --no-deps above and here: the lock alone decides the dependencies; `pip check` proves it whole.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && /opt/build/bin/pip --python /opt/venv/bin/python install --no-deps /dist/*.whl \
 && /opt/build/bin/pip --python /opt/venv/bin/python check

# ---- operator: the kopf operator, non-root, read-only-root-filesystem friendly ----------------
FROM ${BASE} AS operator
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
