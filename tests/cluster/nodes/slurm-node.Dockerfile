# Test infrastructure, never shipped: a Slurm node (slurmctld or slurmd, munge, ssh) of the multi-node harness, made
# from the SIF builder image (apptainer from Debian sid, Open MPI outside the SIF). Jobs run the tfhpc SIF through
# `srun --mpi=pmix apptainer exec`, as on a site, or a Charliecloud directory image through `srun ... ch-run`. Keys (munge, ssh host and user) are made per run, never stored here.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
USER root
ARG SLURM_PACKAGE_VERSION
ARG PMIX_PACKAGE
COPY containers/base/apt-install /usr/local/sbin/
# sid served apptainer only (its Release file may be past Valid-Until): Slurm and the rest come from the OS release.
# Slurm's mpi/pmix plugin opens the unversioned libpmix.so, which only libpmix-dev ships; libpmix-dev pulls
# libc6-dev, which cannot match sid's libc here, so the two links it would add are made by hand.
RUN --mount=type=secret,id=ca_bundle set -eu; \
    rm -f /etc/apt/sources.list.d/sid.list /etc/apt/preferences.d/sid; \
    apt-install openssh-server munge "${PMIX_PACKAGE}" charliecloud-runtime \
        "slurmctld=${SLURM_PACKAGE_VERSION}" "slurmd=${SLURM_PACKAGE_VERSION}" \
        "slurm-client=${SLURM_PACKAGE_VERSION}" "slurm-wlm-basic-plugins=${SLURM_PACKAGE_VERSION}"; \
    sed -i 's/^session\s*required\s*pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd; \
    pmix=/usr/lib/x86_64-linux-gnu/pmix2/lib; \
    ln -s "$(basename "$(readlink -f "${pmix}/libpmix.so.2")")" "${pmix}/libpmix.so"; \
    ln -s pmix2/lib/libpmix.so /usr/lib/x86_64-linux-gnu/libpmix.so; \
    rm -f /etc/ssh/ssh_host_* /etc/munge/munge.key; \
    mkdir -p /var/lib/slurm/slurmd /var/lib/slurm/slurmctld /var/log/slurm /run/munge
COPY tests/cluster/nodes/start-node /usr/local/sbin/
CMD ["start-node", "sshd"]
