#!/usr/bin/env bash
# Busy core-seconds of the whole machine (/proc/stat: user, nice, system, irq, softirq, steal)
# and wall seconds while COMMAND runs: `bash bench/busy_cores.sh COMMAND [ARGS...]`. Counts every
# process, those a command leaves running or never reaps (Ray's) included; run it on a quiet machine.
read -r _ u n s _ _ x y z _ < /proc/stat; busy0=$((u + n + s + x + y + z)); t0=$(date +%s.%N)
"$@"; status=$?
read -r _ u n s _ _ x y z _ < /proc/stat; busy1=$((u + n + s + x + y + z)); t1=$(date +%s.%N)
ticks=$(getconf CLK_TCK)
echo "busy core-seconds: $(echo "scale=1; ($busy1 - $busy0) / $ticks" | bc)  wall seconds: $(echo "scale=1; ($t1 - $t0) / 1" | bc)" >&2
exit $status
