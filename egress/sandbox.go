package egress

// SandboxListen is where programs inside a sandbox with an allowlist find their HTTP
// proxy: roche-agent's loopback port, which relays each connection, as it is, to the
// host's Proxy (the sandbox has no other interface).
const SandboxListen = "127.0.0.1:3128"

// SandboxEnv is the environment that points a sandbox's programs at SandboxListen, as
// NAME=VALUE: the proxy variables in both cases, and loopback left direct.
func SandboxEnv() []string {
	var env []string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env = append(env, k+"=http://"+SandboxListen)
	}
	return append(env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
}
