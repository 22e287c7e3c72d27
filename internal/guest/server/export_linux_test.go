package server

// SetOpenat2Missing makes the files API resolve paths as on a kernel without openat2
// (one directory at a time), or as it does by default; it returns the previous setting.
func SetOpenat2Missing(missing bool) bool { return openat2Missing.Swap(missing) }
