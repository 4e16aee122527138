# Test infrastructure, never shipped: the registry of the publishing tests, Debian's docker-registry (the CNCF
# distribution server) on the stack's base image, so that the tests need no registry program on the host.
# tests/publish/conftest.py starts it on the host's network at a free 127.0.0.1 port and removes it afterwards.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
USER root
ARG DOCKER_REGISTRY_PACKAGE_VERSION
RUN --mount=type=secret,id=ca_bundle apt-install "docker-registry=${DOCKER_REGISTRY_PACKAGE_VERSION}"
USER tfhpc
ENTRYPOINT ["/usr/bin/docker-registry", "serve"]
