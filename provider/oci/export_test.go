package oci

// SetCompiledSeccomp replaces the compiled seccomp filter (base64) the provider's runtime
// hands its next sandboxes, once it has resolved one.
func (p *Provider) SetCompiledSeccomp(b64 string) {
	p.rtMu.Lock()
	rt := p.rt
	p.rtMu.Unlock()
	if rt != nil {
		rt.seccompBPF.Store(&b64)
	}
}
