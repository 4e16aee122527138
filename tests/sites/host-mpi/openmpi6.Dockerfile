# A host Open MPI 6 for the site tests (tests/sites/test_abi_host_mpi.py): Open MPI 6.0 is the first release with
# the MPI 5.0 standard ABI (libmpi_abi.so.1), and its only binaries today are Debian sid's release candidate
# packages (no PyPI wheel; the source tarball is not on the mirror). This image installs them on the OS root and
# assembles /prefix as a site's module would have it: bin/ with the launcher (prterun) and its daemon (prted), lib/
# with libmpi_abi.so.1 and every library it and the launcher load, except the C and C++ run-times, which a site's
# MPI takes from the node's system. The tests copy /prefix into build/site-mpi/. Never part of a tfhpc image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG APT_MIRROR
ARG OPENMPI6_PACKAGE_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# sid's Release file can be past its Valid-Until on a mirror: accepted for the sid source only, pinned below the OS.
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca_bundle set -eux; \
    ca_opt=(); if [ -s /run/secrets/ca_bundle ]; then ca_opt=(-o Acquire::https::CAInfo=/run/secrets/ca_bundle); fi; \
    echo "deb [check-valid-until=no] ${APT_MIRROR} sid main" > /etc/apt/sources.list.d/sid.list; \
    printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' > /etc/apt/preferences.d/sid; \
    apt-get "${ca_opt[@]}" update -qq; \
    DEBIAN_FRONTEND=noninteractive apt-get "${ca_opt[@]}" install -y -qq --no-install-recommends -t sid \
        "openmpi-bin=${OPENMPI6_PACKAGE_VERSION}" "libopenmpi40=${OPENMPI6_PACKAGE_VERSION}"; \
    rm -rf /var/lib/apt/lists/*
RUN set -eux; \
    mkdir -p /prefix/bin /prefix/lib; \
    library=$(ldconfig -p | awk '$1 == "libmpi_abi.so.1" {print $NF; exit}'); \
    test -n "${library}"; \
    cp -L "${library}" /prefix/lib/libmpi_abi.so.1; \
    cp -L "$(command -v prterun)" "$(command -v prted)" /prefix/bin/; \
    ldd "${library}" /prefix/bin/prterun /prefix/bin/prted | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u \
      | grep -vE '^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^ ]*)\.so' \
      | while read -r soname path; do cp -L "${path}" "/prefix/lib/${soname}"; done; \
    echo "Open MPI ${OPENMPI6_PACKAGE_VERSION} (Debian sid)" > /prefix/.installed
