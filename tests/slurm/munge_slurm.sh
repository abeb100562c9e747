# Sourced by tests/slurm/ci_slurm.sh and tests/multinode/run.sh: Slurm and
# munge where they are missing (Debian's packages), and munged running.
# slurm_install: 0 when slurmctld and munged are there (installed if not).
# munge_start: munge's directories and key, munged started as the munge
# user unless one runs; sets STARTED_MUNGE=1 when it started it (the
# caller stops it then).

slurm_install() {
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        echo "installing slurm-wlm and munge"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
}

munge_start() {
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    STARTED_MUNGE=0
    if ! pgrep -x munged >/dev/null; then
        runuser -u munge -- munged
        STARTED_MUNGE=1
    fi
}
