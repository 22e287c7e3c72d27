package samples

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/stat's times on Linux.
const clockTick = 100

// HostBusy returns the CPU time the whole host has spent on anything but idling (and
// waiting for I/O) since it booted, from /proc/stat, or 0 where it cannot be read. Two
// readings around a load give its cost in CPU time, whichever process or kernel thread
// paid it; the host's other work is in it too, so it means most on a quiet machine.
func HostBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 8 || string(f[0]) != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest times are in user already
			continue
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / clockTick
}
