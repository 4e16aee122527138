# Test infrastructure, never shipped: a node of the multi-node harness (tests/cluster) made from the app image plus an
# ssh server, so that mpirun and horovodrun start remote ranks the way they do on a cluster without a scheduler.
# Host keys and user keys are made when a node starts and per run (tests/cluster/harness.py); none is in this image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
USER root
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# pam_loginuid cannot write a login uid in a container: optional, or ssh logins fail.
# ssh sessions do not see Docker's ENV: /etc/environment (read by PAM) gives remote ranks the image's PATH and
# settings, as a site's module or profile would.
RUN --mount=type=secret,id=ca_bundle set -eu; \
    apt-install openssh-server; \
    sed -i 's/^session\s*required\s*pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd; \
    rm -f /etc/ssh/ssh_host_*; \
    env | grep -E '^(PATH|LANG|LC_ALL|PYTHONDONTWRITEBYTECODE|TF_[A-Z_]+|OMPI_MCA_[a-z_]+|TFHPC_[A-Z_]+)=' \
        > /etc/environment
COPY tests/cluster/nodes/start-node /usr/local/sbin/
ENTRYPOINT []
CMD ["start-node", "sshd"]
