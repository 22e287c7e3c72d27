package server

// SetOpenat2Missing makes the files API resolve paths as on a kernel without openat2
// (one directory at a time), or as it does by default; it returns the previous setting.
func SetOpenat2Missing(missing bool) bool { return openat2Missing.Swap(missing) }

// SetBeforeOOMFirst has f run before each command's OOM score is raised; restore puts
// back what ran before.
func SetBeforeOOMFirst(f func(pid int)) (restore func()) {
	prev := beforeOOMFirst.Swap(&f)
	return func() { beforeOOMFirst.Store(prev) }
}
