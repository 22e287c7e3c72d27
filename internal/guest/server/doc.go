// Package server is roche-agent's side of the agent protocol (package guest): it runs
// as PID 1 inside a sandbox, reaps zombies, forwards signals, runs commands as the
// sandbox user with no capabilities, and serves the files API. Linux only.
package server
