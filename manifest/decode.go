package manifest

import (
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/errdefs"
	"github.com/stagehost/stagehost/hw"
	"github.com/stagehost/stagehost/hw/cuda"
	"github.com/stagehost/stagehost/hw/sim"
	"github.com/stagehost/stagehost/sessions/exchange"
	"github.com/stagehost/stagehost/stages"
)

// Defaults and limits (documented in docs/manifest.md).
const (
	defaultCapacity        = 64
	defaultTraceBuffer     = 4096
	defaultQueueDepth      = 1024
	maxQueueDepth          = 1 << 16
	defaultMemoryLimit     = 64 << 20
	maxMemoryLimit         = 4 << 30
	defaultBudget          = 64 << 20
	defaultOutputLimit     = 16 << 20
	defaultDeadline        = 5 * time.Second
	defaultFenceTimeout    = 10 * time.Second
	defaultInitTimeout     = 5 * time.Second
	defaultMaxModuleSize   = stages.DefaultMaxModuleSize
	maxModuleSize          = 4 << 30
	defaultEntry           = "main"
	defaultRounds          = 16
	maxRounds              = 1_000_000
	defaultPayload         = exchange.PayloadSize
	defaultStartupDeadline = time.Second
	defaultJoinDeadline    = 5 * time.Second
	defaultResidentBudget  = 1 << 20
	defaultMaxRuns         = 4
	maxMaxRuns             = 1 << 16
	defaultHistory         = 100
	defaultMaxQuarantined  = 4
	maxMaxQuarantined      = 1 << 16
	defaultMaxParked       = 32
	maxMaxParked           = 1 << 16
	defaultQueueLimit      = 256
	maxQueueLimit          = 1 << 20
	defaultQueueTimeout    = 10 * time.Second
	maxInstances           = 1024
	maxHistory             = 1_000_000
	maxTokenFileSize       = 64 << 10
	maxTLSFileSize         = 1 << 20
	minHeartbeatTTL        = 100 * time.Millisecond
	maxHeartbeatTTL        = time.Hour
	maxLatticeReplicas     = 5
	minPayloadStoreMax     = 64 << 10
	maxPayloadStoreMax     = 1 << 40
	maxFenceFailures       = 1 << 16
)

// wasmPage is the WebAssembly page size: module memory limits are whole
// pages.
const wasmPage = 64 << 10

// The per-entry facts the cross-checks need: where each entry is, and
// which of its values decoded (so that one bad value is reported once,
// not again by every check that uses it).
type (
	devMeta struct {
		p                         keyPath
		name, backend, engine, sz bool
		faults                    []faultMeta
	}
	faultMeta struct {
		p                     keyPath
		kind, session, counts bool // counts: count was written
	}
	modMeta struct {
		p          keyPath
		name, kind bool
	}
	sessMeta struct {
		p                                 keyPath
		name, stage, fence, device, bytes bool
		devices                           []keyPath // where each of Devices is named
	}
	resMeta struct {
		p                                 keyPath
		name, gpu, npu, budgeted, payload bool
	}
)

func (d *decoder) decode(data []byte) *Manifest {
	raw, ok := d.parse(data)
	if !ok {
		return nil
	}
	root := d.newTable(nil, raw)
	m := &Manifest{Path: d.file, Dir: d.dir}
	if v, p, present := root.get("version", true); present {
		n, isInt := v.(int64)
		switch {
		case !isInt:
			d.wrongType(p, "the integer 1", v)
		case n != Version:
			// Another version has another schema: anything more would be noise.
			d.errorf(p, "unsupported manifest version %d: this stagehost reads version %d", n, Version)
			return nil
		}
		m.Version = int(n)
	}
	m.Runtime = Runtime{Capacity: defaultCapacity, TraceBuffer: defaultTraceBuffer, MaxModuleSize: defaultMaxModuleSize}
	d.moduleLimit = fileLimit{defaultMaxModuleSize, "the module size limit", " (the default: raise it with runtime.max_module_size or the module's max_size)"}
	d.runtime(root, m)
	d.service(root, m)
	d.lattice(root, m)
	d.tracing(root, m)
	devs := d.devices(root, m)
	mods := d.modules(root, m)
	wts := d.weightsList(root, m)
	kerns := d.kernels(root, m)
	sess := d.sessions(root, m)
	res := d.residents(root, m)
	tens := d.tenants(root, m)
	root.finish()

	// A reference to an entry whose name did not decode is not reported:
	// the name's own error says what is wrong.
	d.badNames = map[string]bool{}
	for _, x := range devs {
		d.badNames["device"] = d.badNames["device"] || !x.name
	}
	for _, x := range mods {
		d.badNames["module"] = d.badNames["module"] || !x.name
	}
	for _, x := range wts {
		d.badNames["weights"] = d.badNames["weights"] || !x.name
	}
	for _, x := range kerns {
		d.badNames["kernel"] = d.badNames["kernel"] || !x.name
	}
	for _, x := range sess {
		d.badNames["session"] = d.badNames["session"] || !x.name
	}
	d.checkDevices(m, devs)
	d.checkModules(m, mods)
	d.checkSessions(m, devs, mods, sess, res)
	d.checkWeights(m, sess)
	d.checkTenants(m, tens, sess)
	d.checkFaults(m, devs, sess)
	d.checkResidents(m, devs, res)
	d.checkDeviceMemory(m, devs, sess, res)
	d.checkLatticeNames(m, sess, res)
	return m
}

// checkLatticeNames: in a lattice every session and resident name is a
// NATS subject token (its subjects and KV keys hold it), so such a name
// is letters, digits, '-' and '_'.
func (d *decoder) checkLatticeNames(m *Manifest, sess []sessMeta, res []resMeta) {
	if m.Lattice == nil {
		return
	}
	for i, x := range sess {
		if x.name && !validLatticeName(m.Sessions[i].Name) {
			d.errorf(x.p.key("name"), "%q: in a lattice a session name is letters, digits, '-' and '_' (one NATS subject token)", m.Sessions[i].Name)
		}
	}
	for i, x := range res {
		if x.name && !validLatticeName(m.Residents[i].Name) {
			d.errorf(x.p.key("name"), "%q: in a lattice a resident name is letters, digits, '-' and '_' (one NATS subject token)", m.Residents[i].Name)
		}
	}
}

func (d *decoder) runtime(root *table, m *Manifest) {
	t := root.sub("runtime")
	if t == nil {
		return
	}
	n, _ := t.integer("capacity", defaultCapacity, 1, math.MaxInt)
	m.Runtime.Capacity = int(n)
	n, _ = t.integer("trace_buffer", defaultTraceBuffer, 1, math.MaxInt)
	m.Runtime.TraceBuffer = int(n)
	dir, _ := t.str("cache_dir", "", false)
	if dir != "" && dir != CacheOff {
		dir = resolve(d.dir, dir)
	}
	m.Runtime.CacheDir = dir
	if n, ok := t.size("max_module_size", defaultMaxModuleSize, 1, maxModuleSize); ok {
		m.Runtime.MaxModuleSize = n
		if t.has("max_module_size") {
			d.moduleLimit = fileLimit{n, "the module size limit", " (set by " + t.path.key("max_module_size").String() + ")"}
		}
	}
	t.finish()
}

func (d *decoder) service(root *table, m *Manifest) {
	m.Service = DefaultService()
	t := root.sub("service")
	if t == nil {
		return
	}
	sv := &m.Service
	sv.ReadHeaderTimeout, _ = t.duration("read_header_timeout", sv.ReadHeaderTimeout, false)
	sv.ReadTimeout, _ = t.duration("read_timeout", sv.ReadTimeout, false)
	sv.WriteTimeout, _ = t.duration("write_timeout", sv.WriteTimeout, false)
	sv.IdleTimeout, _ = t.duration("idle_timeout", sv.IdleTimeout, false)
	sv.DrainDelay, _ = t.duration("drain_delay", 0, false)
	n, _ := t.integer("max_connections", int64(sv.MaxConnections), 0, math.MaxInt32)
	sv.MaxConnections = int(n)
	n, _ = t.integer("max_in_flight", int64(sv.MaxInFlight), 0, math.MaxInt32)
	sv.MaxInFlight = int(n)
	sv.ReadyQuarantinedShare, _ = t.fraction("ready_quarantined_share", 0)
	sv.AdminTokenFile = d.serviceFile(t, "admin_token_file", fileLimit{maxTokenFileSize, "the token file size limit", ""})
	sv.InvokeTokenFile = d.serviceFile(t, "invoke_token_file", fileLimit{maxTokenFileSize, "the token file size limit", ""})
	sv.AdminTokenEnv = d.envName(t, "admin_token_env")
	sv.InvokeTokenEnv = d.envName(t, "invoke_token_env")
	sv.TLSCert, sv.TLSKey = d.tlsPair(t)
	t.finish()
}

func (d *decoder) lattice(root *table, m *Manifest) {
	if !root.has("lattice") {
		return
	}
	t := root.sub("lattice")
	if t == nil {
		return
	}
	lt := &Lattice{HeartbeatTTL: DefaultHeartbeatTTL, ClaimTTL: DefaultClaimTTL, FenceFailures: DefaultFenceFailures, QuarantineOnDeviceLost: true, PayloadStoreMax: DefaultPayloadStoreMax}
	m.Lattice = lt
	d.latticeIdentity(t, lt)
	d.latticeServer(t, lt)
	creds := d.latticeCredentials(t, lt)
	if lt.Embedded && t.has("listen") && len(creds) == 0 && !LoopbackAddr(lt.Listen) {
		d.errorf(t.path.key("listen"), "an embedded server on the non-loopback address %q needs credentials (token_file, token_env or nkey_seed_file)", lt.Listen)
	}
	d.latticeTimers(t, lt)
	n, _ := t.integer("fence_failures", DefaultFenceFailures, 0, maxFenceFailures)
	lt.FenceFailures = int(n)
	lt.QuarantineOnDeviceLost, _ = t.boolean("quarantine_on_device_lost", true)
	n, _ = t.integer("replicas", 1, 1, maxLatticeReplicas)
	lt.Replicas = int(n)
	lt.PayloadStoreMax, _ = t.size("payload_store_max", DefaultPayloadStoreMax, minPayloadStoreMax, maxPayloadStoreMax)
	t.finish()
}

// latticeIdentity decodes the names a lattice and this host go by: each
// one NATS subject token.
func (d *decoder) latticeIdentity(t *table, lt *Lattice) {
	if name, ok := t.name("name"); ok {
		if validLatticeName(name) {
			lt.Name = name
		} else {
			d.errorf(t.path.key("name"), "%q: a lattice name is letters, digits, '-' and '_' (one NATS subject token)", name)
		}
	}
	if id, ok := t.str("host_id", "", false); ok && t.has("host_id") {
		if validLatticeName(id) {
			lt.HostID = id
		} else {
			d.errorf(t.path.key("host_id"), "%q: a host id is letters, digits, '-' and '_' (leave it out for the hostname and process id)", id)
		}
	}
}

// latticeServer decodes which NATS server the lattice uses: one to
// connect to (url), or one to start (embedded = true), exactly one of
// the two.
func (d *decoder) latticeServer(t *table, lt *Lattice) {
	lt.Embedded, _ = t.boolean("embedded", false)
	if u, ok := t.str("url", "", false); ok && t.has("url") {
		if err := checkNATSURLs(u); err != nil {
			d.errorf(t.path.key("url"), "%v", err)
		} else {
			lt.URL = u
		}
	}
	switch {
	case t.has("url") && lt.Embedded:
		d.errorf(t.path.key("url"), "url and embedded = true exclude each other: connect to a server, or start one")
	case !t.has("url") && !lt.Embedded && t.has("embedded"):
		d.errorf(t.path.key("embedded"), "embedded = false needs url: the lattice needs a NATS server")
	case !t.has("url") && !t.has("embedded"):
		d.errorf(t.path, "needs url (a NATS server) or embedded = true (start one in the process)")
	}
	d.latticeEmbedded(t, lt)
}

// latticeEmbedded decodes the keys of an embedded server, listen and
// store_dir, which need embedded = true.
func (d *decoder) latticeEmbedded(t *table, lt *Lattice) {
	lt.Listen = DefaultLatticeListen
	if l, ok := t.str("listen", DefaultLatticeListen, false); ok && t.has("listen") {
		if _, port, err := net.SplitHostPort(l); err != nil || !validPort(port) {
			d.errorf(t.path.key("listen"), "%q is not a host:port address (for example \"127.0.0.1:4222\")", l)
		} else {
			lt.Listen = l
		}
	}
	if dir, ok := t.str("store_dir", "", false); ok && t.has("store_dir") {
		if dir == "" {
			d.errorf(t.path.key("store_dir"), "must not be empty: leave store_dir out for the default")
		} else {
			lt.StoreDir = resolve(d.dir, dir)
		}
	}
	d.latticeCluster(t, lt)
	for _, k := range []string{"listen", "store_dir", "cluster_listen", "cluster_routes"} {
		if t.has(k) && !lt.Embedded {
			d.errorf(t.path.key(k), "%s is for an embedded server: it needs embedded = true", k)
		}
	}
}

// latticeCluster decodes the keys that make an embedded server a node
// of a NATS cluster: cluster_listen (host:port) and cluster_routes
// (nats-route://host:port URLs, comma-separated), which needs it.
func (d *decoder) latticeCluster(t *table, lt *Lattice) {
	if l, ok := t.str("cluster_listen", "", false); ok && t.has("cluster_listen") {
		if _, port, err := net.SplitHostPort(l); err != nil || !validPort(port) {
			d.errorf(t.path.key("cluster_listen"), "%q is not a host:port address (for example \"0.0.0.0:6222\")", l)
		} else {
			lt.ClusterListen = l
		}
	}
	if r, ok := t.str("cluster_routes", "", false); ok && t.has("cluster_routes") {
		if err := checkRouteURLs(r); err != nil {
			d.errorf(t.path.key("cluster_routes"), "%v", err)
		} else {
			lt.ClusterRoutes = r
		}
		if !t.has("cluster_listen") {
			d.errorf(t.path.key("cluster_routes"), "cluster_routes needs cluster_listen: the address this node's routes listen on")
		}
	}
}

// checkRouteURLs checks a comma-separated list of NATS route URLs.
func checkRouteURLs(s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("must not be empty: route URLs such as \"nats-route://10.0.0.5:6222,nats-route://10.0.0.6:6222\"")
	}
	for _, one := range strings.Split(s, ",") {
		one = strings.TrimSpace(one)
		u, err := url.Parse(one)
		if err == nil && u.User != nil {
			return fmt.Errorf("a route URL holds credentials: routes here take none")
		}
		if err != nil || u.Host == "" || u.Port() == "" || !validPort(u.Port()) {
			return fmt.Errorf("%q is not a route URL (for example \"nats-route://10.0.0.5:6222\")", one)
		}
		if u.Scheme != "nats-route" && u.Scheme != "nats" {
			return fmt.Errorf("%q: the scheme must be nats-route, not %q", one, u.Scheme)
		}
	}
	return nil
}

// latticeCredentials decodes where the lattice's credential (at most
// one) and TLS files are; it returns the credential keys present.
func (d *decoder) latticeCredentials(t *table, lt *Lattice) []string {
	lt.TokenFile = d.serviceFile(t, "token_file", fileLimit{maxTokenFileSize, "the token file size limit", ""})
	lt.TokenEnv = d.envName(t, "token_env")
	lt.NkeySeedFile = d.serviceFile(t, "nkey_seed_file", fileLimit{maxTokenFileSize, "the nkey seed file size limit", ""})
	var creds []string
	for _, k := range []string{"token_file", "token_env", "nkey_seed_file"} {
		if t.has(k) {
			creds = append(creds, k)
		}
	}
	if len(creds) > 1 {
		d.errorf(t.path.key(creds[1]), "%s and %s exclude each other: one credential", creds[0], creds[1])
	}
	lt.TLSCA = d.serviceFile(t, "tls_ca", fileLimit{maxTLSFileSize, "the TLS file size limit", ""})
	lt.TLSCert, lt.TLSKey = d.tlsPair(t)
	return creds
}

// latticeTimers decodes heartbeat_ttl and claim_ttl: a claim outlives
// two heartbeats.
func (d *decoder) latticeTimers(t *table, lt *Lattice) {
	if ttl, ok := t.duration("heartbeat_ttl", DefaultHeartbeatTTL, true); ok {
		if ttl < minHeartbeatTTL || ttl > maxHeartbeatTTL {
			d.errorf(t.path.key("heartbeat_ttl"), "must be between %v and %v, not %v", minHeartbeatTTL, maxHeartbeatTTL, ttl)
		} else {
			lt.HeartbeatTTL = ttl
		}
	}
	if ttl, ok := t.duration("claim_ttl", DefaultClaimTTL, true); ok {
		switch {
		case ttl > maxHeartbeatTTL:
			d.errorf(t.path.key("claim_ttl"), "must be at most %v, not %v", maxHeartbeatTTL, ttl)
		case ttl < 2*lt.HeartbeatTTL:
			// A holder renews its claims with each heartbeat (every
			// heartbeat_ttl/3) and stops serving once half of claim_ttl
			// passed without a renewal: below 2 × heartbeat_ttl a healthy
			// holder would drop its claims between two heartbeats.
			d.errorf(t.path.key("claim_ttl"), "must be at least twice heartbeat_ttl (%v), not %v: a holder renews its placement claims with each heartbeat", lt.HeartbeatTTL, ttl)
		default:
			lt.ClaimTTL = ttl
		}
	}
}

// tlsPair decodes tls_cert and tls_key, both or neither.
func (d *decoder) tlsPair(t *table) (cert, key string) {
	cert = d.serviceFile(t, "tls_cert", fileLimit{maxTLSFileSize, "the TLS file size limit", ""})
	key = d.serviceFile(t, "tls_key", fileLimit{maxTLSFileSize, "the TLS file size limit", ""})
	switch {
	case t.has("tls_cert") && !t.has("tls_key"):
		d.errorf(t.path.key("tls_cert"), "tls_cert needs tls_key too")
	case t.has("tls_key") && !t.has("tls_cert"):
		d.errorf(t.path.key("tls_key"), "tls_key needs tls_cert too")
	}
	return cert, key
}

func validLatticeName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0 && n <= 65535
}

// LoopbackAddr reports whether addr (host:port) listens on a loopback
// address only: 127.0.0.0/8, ::1 or localhost. An empty host (every
// interface) is not.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkNATSURLs checks a NATS server URL or a comma-separated list of
// them: nats://, tls://, ws:// or wss://, each with a host and port.
func checkNATSURLs(s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("must not be empty: a NATS server URL such as \"nats://10.0.0.5:4222\"")
	}
	for i, one := range strings.Split(s, ",") {
		one = strings.TrimSpace(one)
		u, err := url.Parse(one)
		if err == nil && u.User != nil {
			// Not echoed: the user part may be a token written by mistake.
			return fmt.Errorf("URL %d holds credentials: the manifest names where they are (token_file, token_env or nkey_seed_file), it never holds them", i+1)
		}
		if err != nil || u.Host == "" {
			return fmt.Errorf("%q is not a NATS server URL (for example \"nats://10.0.0.5:4222\")", one)
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return fmt.Errorf("%q: the scheme must be nats, tls, ws or wss, not %q", one, u.Scheme)
		}
		if p := u.Port(); p != "" && !validPort(p) {
			return fmt.Errorf("%q: bad port %q", one, p)
		}
	}
	return nil
}

// serviceFile decodes an optional path to a file that must exist, be
// regular and fit limit; it returns the resolved path ("" when absent or
// bad). Its contents are read again when the service starts.
func (d *decoder) serviceFile(t *table, key string, limit fileLimit) string {
	p, ok := t.str(key, "", false)
	if !ok || !t.has(key) {
		return ""
	}
	if p == "" {
		d.errorf(t.path.key(key), "must not be empty: leave %s out for none", key)
		return ""
	}
	file := resolve(d.dir, p)
	if _, err := d.read(file, limit); err != nil {
		d.fileError(t.path.key(key), file, limit, err)
		return ""
	}
	return file
}

// envName decodes an optional environment variable name: A-Z, a-z, 0-9
// and _, not starting with a digit. The variable is read when the
// service starts.
func (d *decoder) envName(t *table, key string) string {
	name, ok := t.str(key, "", false)
	if !ok || !t.has(key) {
		return ""
	}
	valid := name != "" && !(name[0] >= '0' && name[0] <= '9')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			valid = false
		}
	}
	if !valid {
		// The value is not echoed: it may be a token written by mistake.
		d.errorf(t.path.key(key), "must be the name of an environment variable (A-Z, a-z, 0-9 and _, not starting with a digit): the manifest names where tokens are, it never holds one")
		return ""
	}
	return name
}

func validDeviceName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return s != ""
}

func (d *decoder) devices(root *table, m *Manifest) []devMeta {
	list, ok := root.tables("device")
	if ok && len(list) == 0 {
		d.errorf(keyPath{}.key("device"), "at least one [[device]] is required")
	}
	metas := make([]devMeta, len(list))
	m.Devices = make([]Device, len(list))
	for i, t := range list {
		if t != nil {
			d.device(t, &m.Devices[i], &metas[i])
		}
	}
	return metas
}

// device decodes one [[device]]: what it is (name, backend, engine), then
// the keys that depend on that.
func (d *decoder) device(t *table, dev *Device, meta *devMeta) {
	meta.p = t.path
	t.moved = map[string]string{"latency": "[device.sim]", "queue_depth": "[device.sim]", "fault": "[device.sim]"}
	dev.Name, meta.name = t.name("name")
	if meta.name && !validDeviceName(dev.Name) {
		d.errorf(t.path.key("name"), "device name %q may only use a-z, 0-9, \"_\" and \"-\"", dev.Name)
		meta.name = false
	}
	d.deviceBackend(t, dev, meta)
	d.deviceEngine(t, dev, meta)
	isSim := meta.backend && dev.Backend == BackendSim
	isCUDA := meta.backend && dev.Backend == BackendCUDA
	if isSim && t.has("index") {
		d.errorf(t.path.key("index"), "index applies only to cuda devices; %q is a sim device", dev.Name)
	} else {
		n, _ := t.integer("index", 0, 0, math.MaxInt)
		dev.Index = int(n)
	}
	dev.Memory, meta.sz = t.size("memory", 0, 1, math.MaxInt64)
	d.deviceMaxParked(t, dev, meta)
	if isCUDA && t.has("sim") {
		d.errorf(t.path.key("sim"), "only sim devices have a [device.sim] table; %q is a cuda device", dev.Name)
	} else if !isCUDA {
		// Decoded also when the backend is bad, so its own errors show.
		dev.Sim, meta.faults = d.sim(t)
	}
	if !isSim {
		dev.Sim = nil
	}
	t.finish()
}

// deviceBackend decodes a device's backend: sim or cuda.
func (d *decoder) deviceBackend(t *table, dev *Device, meta *devMeta) {
	var backend string
	backend, meta.backend = t.str("backend", "", true)
	if meta.backend {
		dev.Backend = Backend(backend)
		if dev.Backend != BackendSim && dev.Backend != BackendCUDA {
			d.errorf(t.path.key("backend"), "unknown backend %q (want sim or cuda)", backend)
			meta.backend = false
		}
	}
}

// deviceEngine decodes a device's engine: any for sim, gpu or cpu (the
// host device) for cuda.
func (d *decoder) deviceEngine(t *table, dev *Device, meta *devMeta) {
	var engine string
	if engine, meta.engine = t.str("engine", "", true); !meta.engine {
		return
	}
	e, err := hw.ParseEngine(engine)
	if err != nil {
		d.errorf(t.path.key("engine"), "%v", err)
		meta.engine = false
	}
	dev.Engine = e
	// Engine "cpu" names the CUDA platform's host device (host0).
	if meta.engine && meta.backend && dev.Backend == BackendCUDA && e != hw.EngineGPU && e != hw.EngineCPU {
		d.errorf(t.path.key("engine"), "a cuda device must have engine \"gpu\" (or \"cpu\": the host device), not %q", engine)
	}
}

// deviceMaxParked decodes max_parked, which only gpu devices have.
func (d *decoder) deviceMaxParked(t *table, dev *Device, meta *devMeta) {
	if meta.engine && dev.Engine != hw.EngineGPU && t.has("max_parked") {
		d.errorf(t.path.key("max_parked"), "max_parked applies only to gpu devices (resident GPU participants park there); %q has engine %q", dev.Name, dev.Engine.String())
	} else if n, _ := t.integer("max_parked", defaultMaxParked, 1, maxMaxParked); !meta.engine || dev.Engine == hw.EngineGPU {
		dev.MaxParked = int(n)
	}
}

func (d *decoder) sim(dev *table) (*Sim, []faultMeta) {
	t := dev.sub("sim")
	if t == nil {
		return nil, nil
	}
	s := &Sim{}
	s.Latency, _ = t.duration("latency", 0, false)
	n, _ := t.integer("queue_depth", defaultQueueDepth, 1, maxQueueDepth)
	s.QueueDepth = int(n)
	list, _ := t.tables("fault")
	metas := make([]faultMeta, len(list))
	s.Faults = make([]Fault, len(list))
	for i, ft := range list {
		if ft == nil {
			continue
		}
		f, meta := &s.Faults[i], &metas[i]
		meta.p = ft.path
		var kind string
		if kind, meta.kind = ft.str("kind", "", true); meta.kind {
			f.Kind = FaultKind(kind)
			switch f.Kind {
			case FaultReject, FaultFailCompletion, FaultHang, FaultFailVisibility, FaultLose:
			default:
				d.errorf(ft.path.key("kind"), "unknown fault kind %q (want reject, fail_completion, hang, fail_visibility or lose)", kind)
				meta.kind = false
			}
		}
		meta.counts = ft.has("count")
		n, _ := ft.integer("count", 1, 1, math.MaxInt)
		f.Count = int(n)
		f.Session, meta.session = ft.str("session", "", false)
		ft.finish()
	}
	t.finish()
	return s, metas
}

func (d *decoder) modules(root *table, m *Manifest) []modMeta {
	list, _ := root.tables("module")
	d.moduleCount = len(list)
	metas := make([]modMeta, len(list))
	m.Modules = make([]Module, len(list))
	for i, t := range list {
		if t == nil {
			continue
		}
		mod, meta := &m.Modules[i], &metas[i]
		keys := d.module(t, m, mod, meta)
		d.moduleFile(t, mod, keys)
	}
	return metas
}

// moduleKeys is what the checks of a module's file need from its table:
// the values, and which of them decoded.
type moduleKeys struct {
	path, sum               string
	pathOK, sumOK, sumSet   bool
	sumMalformed            bool // set, a string, but not 64 hex digits
	kindOK, limitOK, wasiOK bool
	limit                   fileLimit // the file's size limit
}

// module decodes one [[module]] table; its file is read by moduleFile.
func (d *decoder) module(t *table, m *Manifest, mod *Module, meta *modMeta) moduleKeys {
	var k moduleKeys
	meta.p = t.path
	mod.Name, meta.name = t.name("name")
	if meta.name && (mod.Name == FenceBuiltin || mod.Name == FenceDrain) {
		d.errorf(t.path.key("name"), "%q is reserved: a session's fence = %q means the built-in fence, not a module", mod.Name, mod.Name)
	}
	k.path, k.pathOK = t.name("path")
	k.sum, k.sumOK, k.sumSet, k.sumMalformed = d.moduleSHA256(t)
	mod.Kind, k.kindOK = d.moduleKind(t)
	meta.kind = k.kindOK
	mod.MemoryLimit, k.limitOK = d.moduleMemoryLimit(t)
	k.limit = d.moduleLimit
	if n, ok := t.size("max_size", m.Runtime.MaxModuleSize, 1, maxModuleSize); ok && t.has("max_size") {
		k.limit = fileLimit{n, "the module size limit", " (set by " + t.path.key("max_size").String() + ")"}
	}
	mod.MaxSize = k.limit.size
	mod.Snapshot, _ = t.boolean("snapshot", true)
	mod.WASI, k.wasiOK = d.moduleWASI(t)
	t.finish()
	return k
}

// moduleSHA256 decodes the declared sha256: 64 hex digits, lower-cased.
// A string that is not 64 hex digits (an empty one included) is reported
// by moduleFile, which can add the file's actual hash: malformed is true.
func (d *decoder) moduleSHA256(t *table) (sum string, ok, set, malformed bool) {
	sum, ok = t.str("sha256", "", false)
	set = t.has("sha256")
	if ok && set {
		if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
			return sum, false, set, true
		}
		sum = strings.ToLower(sum)
	}
	return sum, ok, set, false
}

// malformedSHA256 reports a declared sha256 that is not 64 hex digits,
// with the file's actual hash when the file was read (actual non-empty),
// so that an author can accept it after checking it is the file meant.
func (d *decoder) malformedSHA256(t *table, sum, actual string) {
	p := t.path.key("sha256")
	switch {
	case actual == "":
		d.errorf(p, "must be 64 hexadecimal digits, got %q", sum)
	case sum == "":
		d.errorf(p, "must be 64 hexadecimal digits, got \"\" (the file's sha256 is %s)", actual)
	default:
		d.errorf(p, "must be 64 hexadecimal digits, got %q (the file's sha256 is %s)", sum, actual)
	}
}

// moduleKind decodes a module's kind: stage (the default) or fence.
func (d *decoder) moduleKind(t *table) (stages.ModuleKind, bool) {
	kind, ok := t.str("kind", "stage", false)
	switch kind {
	case "stage":
		return stages.StageModule, ok
	case "fence":
		return stages.FenceModule, ok
	}
	if ok {
		d.errorf(t.path.key("kind"), "unknown module kind %q (want stage or fence)", kind)
	}
	return 0, false
}

// moduleMemoryLimit decodes memory_limit: whole WebAssembly pages.
func (d *decoder) moduleMemoryLimit(t *table) (int64, bool) {
	n, ok := t.size("memory_limit", defaultMemoryLimit, wasmPage, maxMemoryLimit)
	if ok && n%wasmPage != 0 {
		d.errorf(t.path.key("memory_limit"), "must be a whole number of 64KiB WebAssembly pages, not %s", FormatSize(n))
		ok = false
	}
	return n, ok
}

// moduleWASI decodes the WASI grants: go-runtime or some of the functions
// it stands for, each once.
func (d *decoder) moduleWASI(t *table) ([]string, bool) {
	wasi, ok := t.strings("wasi", nil)
	for j, g := range wasi {
		p := t.path.key("wasi").at(j)
		switch {
		case g != stages.GrantGoRuntime && !contains(abi.GoRuntimeWASI, g):
			d.errorf(p, "%q cannot be granted: grant %q, or some of the WASI functions it stands for (%s, ...)", g, stages.GrantGoRuntime, strings.Join(abi.GoRuntimeWASI[:3], ", "))
			ok = false
		case contains(wasi[:j], g):
			d.errorf(p, "%q is granted twice", g)
			ok = false
		}
	}
	if wasi == nil {
		wasi = []string{}
	}
	return wasi, ok
}

// moduleFile reads a module's file, checks it against the declared
// sha256 and runs the module checks on it. A check whose inputs did not
// decode is left out: their own errors say what is wrong.
func (d *decoder) moduleFile(t *table, mod *Module, k moduleKeys) {
	var bin []byte
	if k.pathOK {
		mod.Path = k.path
		mod.File = resolve(d.dir, k.path)
		var err error
		if bin, err = d.read(mod.File, k.limit); err != nil {
			d.fileError(t.path.key("path"), mod.File, k.limit, err)
			k.pathOK = false
		}
	}
	if !k.pathOK {
		if !k.sumSet {
			d.errorf(t.path.key("sha256"), "required key is missing")
		}
		if k.sumMalformed {
			d.malformedSHA256(t, k.sum, "")
		}
		return
	}
	mod.Bytes = bin
	mod.SHA256 = stages.SHA256(bin)
	p := t.path.key("sha256")
	d.hashes = append(d.hashes, ModuleHash{Name: mod.Name, Key: p.String(), Line: d.idx.line(p),
		File: mod.File, Path: mod.Path, Declared: k.sum, SHA256: mod.SHA256})
	switch {
	case k.sumMalformed:
		d.malformedSHA256(t, k.sum, mod.SHA256)
	case !k.sumSet:
		d.errorf(t.path.key("sha256"), "required key is missing (the file's sha256 is %s)", mod.SHA256)
	case k.sumOK && k.sum != mod.SHA256:
		d.errorf(t.path.key("sha256"), "does not match %q: expected %s, the file hashes to %s", mod.File, k.sum, mod.SHA256)
		return // not the file the operator meant: its checks would mislead
	}
	if !k.kindOK || !k.limitOK || !k.wasiOK {
		return // Validate would repeat those errors
	}
	if err := stages.Validate(bin, mod.LoadConfig()); err != nil {
		d.moduleError(t.path.key("path"), mod.Name, err)
		return
	}
	mod.Requires, _ = stages.ReadRequires(bin) // Validate read it
}

// moduleError reports a stages.Validate error at the module's path key,
// one error per line of the message.
func (d *decoder) moduleError(p keyPath, name string, err error) {
	class := errdefs.ClassOf(err)
	if class == nil {
		class = errdefs.ErrInvalidArgument
	}
	msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("module %q: ", name))
	for _, line := range strings.Split(msg, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			d.add(p, class, "module check failed: "+escapeUnprintable(line))
		}
	}
}

// escapeUnprintable writes what strconv.Quote would escape in s (control
// characters, other runes strconv.IsPrint refuses, invalid UTF-8) as Go
// escapes, and leaves the rest as it is: for messages of other packages,
// such as the module checks', that may show strings of the module's own
// (its import names) unquoted.
func escapeUnprintable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			q := strconv.Quote(s[:n])
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

func (d *decoder) sessions(root *table, m *Manifest) []sessMeta {
	list, _ := root.tables("session")
	metas := make([]sessMeta, len(list))
	m.Sessions = make([]Session, len(list))
	for i, t := range list {
		if t != nil {
			d.session(t, &m.Sessions[i], &metas[i])
		}
	}
	return metas
}

// session decodes one [[session]] table.
func (d *decoder) session(t *table, s *Session, meta *sessMeta) {
	meta.p = t.path
	s.Name, meta.name = t.name("name")
	s.Stage, meta.stage = t.name("stage")
	s.Fence, meta.fence = t.str("fence", FenceBuiltin, false)
	if meta.fence && s.Fence == "" {
		d.errorf(t.path.key("fence"), "must not be empty: write %q, %q or the name of a fence module", FenceBuiltin, FenceDrain)
		meta.fence = false
	}
	d.sessionDevices(t, s, meta)
	s.Streams = d.names(t, "streams", "stream", []string{"s0"})
	s.Programs = d.names(t, "programs", "program", []string{})
	s.Weights = d.names(t, "weights", "weights", nil)
	d.sessionTenant(t, s)
	var budgetOK bool
	s.Budget, budgetOK = t.size("budget", defaultBudget, 1, math.MaxInt64)
	s.OutputLimit, _ = t.size("output_limit", defaultOutputLimit, 0, math.MaxInt64)
	s.Deadline, _ = t.duration("deadline", defaultDeadline, true)
	s.FenceTimeout, _ = t.duration("fence_timeout", defaultFenceTimeout, true)
	s.InitTimeout, _ = t.duration("init_timeout", defaultInitTimeout, true)
	d.sessionModes(t, s)
	d.sessionInput(t, s)
	s.MaxInput, _ = t.size("max_input", MaxInputSize, 0, maxModuleSize)
	var n int64
	n, _ = t.integer("instances", int64(max(len(s.Devices), 1)), 1, maxInstances)
	s.Instances = int(n)
	n, _ = t.integer("queue_limit", defaultQueueLimit, 0, maxQueueLimit)
	s.QueueLimit = int(n)
	s.QueueTimeout, _ = t.duration("queue_timeout", defaultQueueTimeout, true)
	sum, sumOK := d.sessionBuffers(t, s)
	meta.bytes = budgetOK
	if budgetOK && sumOK && sum > s.Budget {
		d.errorf(t.path.key("budget"), "the buffers sum to %s, above the budget of %s", FormatSize(sum), FormatSize(s.Budget))
	}
	t.finish()
}

// sessionModes decodes the keys that name one of a fixed set of values
// (reset, placement, output_format), and entry.
func (d *decoder) sessionModes(t *table, s *Session) {
	var ok bool
	if s.Reset, ok = t.str("reset", ResetNone, false); ok && !slices.Contains(ResetModes, s.Reset) {
		d.errorf(t.path.key("reset"), "unknown reset mode %q (want %s)", s.Reset, strings.Join(ResetModes, " or "))
	}
	if s.Placement, ok = t.str("placement", PlacementAny, false); ok && !slices.Contains(Placements, s.Placement) {
		d.errorf(t.path.key("placement"), "unknown placement %q (want %s)", s.Placement, strings.Join(Placements, " or "))
	}
	if s.Entry, ok = t.str("entry", defaultEntry, false); ok && s.Entry == "" {
		d.errorf(t.path.key("entry"), "must not be empty")
	}
	if s.OutputFormat, ok = t.str("output_format", OutputHex, false); ok && !slices.Contains(OutputFormats, s.OutputFormat) {
		d.errorf(t.path.key("output_format"), "unknown output format %q (want %s)", s.OutputFormat, strings.Join(OutputFormats, ", "))
	}
}

// sessionInput decodes a session's default input file, which must be
// there, regular and within the input limit.
func (d *decoder) sessionInput(t *table, s *Session) {
	in, ok := t.str("input", "", false)
	if !ok || !t.has("input") {
		return
	}
	if in == "" {
		d.errorf(t.path.key("input"), "must not be empty: leave input out for no default input")
		return
	}
	s.Input = resolve(d.dir, in)
	// The bytes are read again at run time; here the file must be
	// there, regular and within the limit.
	if _, err := d.read(s.Input, inputLimit); err != nil {
		d.fileError(t.path.key("input"), s.Input, inputLimit, err)
	}
}

// sessionBuffers decodes a session's [[session.buffer]] tables: unique
// names and sizes. It returns the sizes' sum, and whether every size
// decoded.
func (d *decoder) sessionBuffers(t *table, s *Session) (sum int64, sumOK bool) {
	bufs, _ := t.tables("buffer")
	s.Buffers = make([]Buffer, 0, len(bufs))
	sumOK = true
	first := map[string]keyPath{}
	for _, bt := range bufs {
		if bt == nil {
			sumOK = false
			continue
		}
		var b Buffer
		var nameOK, sizeOK bool
		b.Name, nameOK = bt.name("name")
		if nameOK {
			d.unique(bt.path.key("name"), b.Name, "buffer", first)
		}
		if _, _, present := bt.get("size", true); present {
			b.Size, sizeOK = bt.size("size", 0, 1, math.MaxInt64)
		}
		sumOK = sumOK && sizeOK
		sum = addSat(sum, b.Size)
		s.Buffers = append(s.Buffers, b)
		bt.finish()
	}
	return sum, sumOK
}

// sessionDevices decodes a session's device (one) or devices (a list of
// one or more, unique): exactly one of the two keys.
func (d *decoder) sessionDevices(t *table, s *Session, meta *sessMeta) {
	switch one, many := t.has("device"), t.has("devices"); {
	case one && many:
		d.errorf(t.path.key("devices"), "give device or devices, not both")
	case many:
		s.Devices = d.names(t, "devices", "device", nil)
		if len(s.Devices) == 0 {
			if _, _, present := t.get("devices", false); present {
				d.errorf(t.path.key("devices"), "must name at least one device")
			}
			return
		}
		for j := range s.Devices {
			meta.devices = append(meta.devices, t.path.key("devices").at(j))
		}
		s.Device, meta.device = s.Devices[0], true
		return
	case !one:
		d.errorf(t.path.key("device"), "required key is missing: give device, or devices for several")
		return
	}
	s.Device, meta.device = t.name("device")
	if meta.device {
		s.Devices = []string{s.Device}
		meta.devices = []keyPath{t.path.key("device")}
	}
}

// names decodes a list of unique, non-empty names.
func (d *decoder) names(t *table, key, what string, def []string) []string {
	list, _ := t.strings(key, def)
	first := map[string]keyPath{}
	for j, s := range list {
		p := t.path.key(key).at(j)
		if s == "" {
			d.errorf(p, "must not be empty")
			continue
		}
		d.unique(p, s, what, first)
	}
	return list
}

// unique reports name at p if it was seen before (at the path in first).
func (d *decoder) unique(p keyPath, name, what string, first map[string]keyPath) bool {
	if q, ok := first[name]; ok {
		at := ""
		if l := d.idx.line(q); l > 0 {
			at = fmt.Sprintf(", line %d", l)
		}
		d.errorf(p, "duplicate %s name %q (also at %s%s)", what, name, q, at)
		return false
	}
	first[name] = p
	return true
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func (d *decoder) residents(root *table, m *Manifest) []resMeta {
	list, _ := root.tables("resident")
	metas := make([]resMeta, len(list))
	m.Residents = make([]Resident, len(list))
	for i, t := range list {
		if t == nil {
			continue
		}
		r, meta := &m.Residents[i], &metas[i]
		meta.p = t.path
		r.Name, meta.name = t.name("name")
		r.GPU, meta.gpu = t.name("gpu")
		r.NPU, meta.npu = t.name("npu")
		n, _ := t.integer("rounds", defaultRounds, 1, maxRounds)
		r.Rounds = int(n)
		var payloadOK, budgetOK bool
		r.Payload, payloadOK = t.size("payload", defaultPayload, exchange.PayloadSize, math.MaxInt64)
		r.StartupDeadline, _ = t.duration("startup_deadline", defaultStartupDeadline, true)
		r.JoinDeadline, _ = t.duration("join_deadline", defaultJoinDeadline, true)
		r.Budget, budgetOK = t.size("budget", defaultResidentBudget, 1, math.MaxInt64)
		n, _ = t.integer("max_runs", defaultMaxRuns, 1, maxMaxRuns)
		r.MaxRuns = int(n)
		n, _ = t.integer("history", defaultHistory, 1, maxHistory)
		r.History = int(n)
		n, _ = t.integer("max_quarantined", defaultMaxQuarantined, 1, maxMaxQuarantined)
		r.MaxQuarantined = int(n)
		meta.budgeted = budgetOK
		meta.payload = payloadOK
		if payloadOK && budgetOK {
			if need := addSat(StartupLineSize, r.Payload); need > r.Budget {
				d.errorf(t.path.key("budget"), "the %s startup line and the %s payload need %s, above the budget of %s",
					FormatSize(StartupLineSize), FormatSize(r.Payload), FormatSize(need), FormatSize(r.Budget))
			}
		}
		t.finish()
	}
	return metas
}

// --- cross-checks ---

func (d *decoder) checkDevices(m *Manifest, metas []devMeta) {
	first := map[string]keyPath{}
	ordinals := map[int]keyPath{}
	for i, dev := range m.Devices {
		meta := metas[i]
		if meta.p == nil || !meta.name {
			continue
		}
		d.unique(meta.p.key("name"), dev.Name, "device", first)
		// The host device (engine cpu) is no GPU ordinal.
		if meta.backend && dev.Backend == BackendCUDA && !(meta.engine && dev.Engine == hw.EngineCPU) {
			if q, ok := ordinals[dev.Index]; ok {
				d.errorf(meta.p.key("index"), "cuda device %d is already %s (line %d)", dev.Index, q, d.idx.line(q))
			} else {
				ordinals[dev.Index] = meta.p
			}
		}
	}
}

func (d *decoder) checkModules(m *Manifest, metas []modMeta) {
	first := map[string]keyPath{}
	for i, mod := range m.Modules {
		if metas[i].p != nil && metas[i].name {
			d.unique(metas[i].p.key("name"), mod.Name, "module", first)
		}
	}
}

// lookup finds the first entry named name, with the index of its meta.
func lookup[T any](list []T, name string, nameOf func(*T) string) (int, *T) {
	for i := range list {
		if nameOf(&list[i]) == name {
			return i, &list[i]
		}
	}
	return -1, nil
}

func moduleName(m *Module) string   { return m.Name }
func deviceName(d *Device) string   { return d.Name }
func sessionName(s *Session) string { return s.Name }

// notFound reports a reference to nothing, suggesting a close name.
func (d *decoder) notFound(p keyPath, what, name string, names []string) {
	if d.badNames[what] {
		return
	}
	msg := fmt.Sprintf("no %s is named %q", what, name)
	if s := suggest(name, names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	} else if len(names) == 0 {
		msg += fmt.Sprintf(" (there is no [[%s]])", what)
	}
	d.errorf(p, "%s", msg)
}

func namesOf[T any](list []T, nameOf func(*T) string) []string {
	var out []string
	for i := range list {
		if n := nameOf(&list[i]); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (d *decoder) checkSessions(m *Manifest, devs []devMeta, mods []modMeta, sess []sessMeta, res []resMeta) {
	d.checkSessionNames(m, sess, res)
	moduleNames := namesOf(m.Modules, moduleName)
	for i := range m.Sessions {
		s, meta := &m.Sessions[i], sess[i]
		if meta.p == nil {
			continue
		}
		d.checkSessionModules(m, mods, s, meta, moduleNames)
		if meta.device {
			d.checkSessionDevices(m, devs, s, meta)
		}
	}
}

// checkSessionNames: sessions and residents share one namespace.
func (d *decoder) checkSessionNames(m *Manifest, sess []sessMeta, res []resMeta) {
	first := map[string]keyPath{}
	for i, s := range m.Sessions {
		if sess[i].p != nil && sess[i].name {
			d.unique(sess[i].p.key("name"), s.Name, "session", first)
		}
	}
	for i, r := range m.Residents {
		if res[i].p != nil && res[i].name {
			d.unique(res[i].p.key("name"), r.Name, "session", first)
		}
	}
}

// checkSessionModules: a session's stage names a stage module, its fence
// the built-in fence, drain or a fence module.
func (d *decoder) checkSessionModules(m *Manifest, mods []modMeta, s *Session, meta sessMeta, moduleNames []string) {
	if meta.stage {
		j, mod := lookup(m.Modules, s.Stage, moduleName)
		switch {
		case mod == nil:
			d.notFound(meta.p.key("stage"), "module", s.Stage, moduleNames)
		case mods[j].kind && mod.Kind != stages.StageModule:
			d.errorf(meta.p.key("stage"), "module %q is a fence module: stage must name a stage module", s.Stage)
		default:
			// The module's declared requirements (abi/ABI.md §7): one
			// error listing every item the session lacks.
			if err := mod.Requires.Check(mod.Name, s.Offer(mod.WASI)); err != nil {
				d.add(meta.p.key("stage"), errdefs.ErrFailedPrecondition, err.Error())
			}
		}
	}
	if meta.fence && s.Fence != FenceBuiltin && s.Fence != FenceDrain {
		j, mod := lookup(m.Modules, s.Fence, moduleName)
		switch {
		case mod == nil:
			d.notFound(meta.p.key("fence"), "module", s.Fence, append([]string{FenceBuiltin, FenceDrain}, moduleNames...))
		case mods[j].kind && mod.Kind != stages.FenceModule:
			d.errorf(meta.p.key("fence"), "module %q is a stage module: fence must be %q, %q or a fence module", s.Fence, FenceBuiltin, FenceDrain)
		}
	}
}

// checkSessionDevices: a session's devices exist and share one backend
// and one engine, the first of them has its programs.
func (d *decoder) checkSessionDevices(m *Manifest, devs []devMeta, s *Session, meta sessMeta) {
	var first *Device // the first device, when its backend and engine decoded
	for k, name := range s.Devices {
		if name == "" {
			continue // reported
		}
		j, dev := lookup(m.Devices, name, deviceName)
		if dev == nil {
			d.notFound(meta.devices[k], "device", name, namesOf(m.Devices, deviceName))
			continue
		}
		if !devs[j].backend || !devs[j].engine {
			continue
		}
		if first == nil {
			first = dev
			d.checkPrograms(m, s, meta, dev)
			continue
		}
		if dev.Backend != first.Backend || dev.Engine != first.Engine {
			d.errorf(meta.devices[k], "device %q is %s with engine %s, and %q is %s with engine %s: a session's devices must all have one backend and one engine",
				name, dev.Backend, dev.Engine, first.Name, first.Backend, first.Engine)
		}
	}
}

// checkPrograms: every program a session names is one dev's backend has.
func (d *decoder) checkPrograms(m *Manifest, s *Session, meta sessMeta, dev *Device) {
	known, ok := programNames(dev)
	if !ok {
		return
	}
	for k, prog := range s.Programs {
		if prog != "" && d.vendorProgram(meta.p.key("programs").at(k), prog, dev, m) {
			continue
		}
		if prog != "" && !slices.Contains(known, prog) {
			d.noProgram(meta.p.key("programs").at(k), prog, dev, known, kernelNames(m))
		}
	}
}

// kernelNames lists the names of the manifest's [[kernel]]s, those that
// are kernel names (a refused name is no program a session could list).
func kernelNames(m *Manifest) []string {
	names := make([]string, 0, len(m.Kernels))
	for _, k := range m.Kernels {
		if validWeightsName(k.Name) {
			names = append(names, k.Name)
		}
	}
	return names
}

// programNames lists the programs a session on dev can prepare, from the
// registry its device's backend looks them up in at run time: the
// simulator's kernels (every engine of a sim device), the kernels of the
// CUDA module a cuda GPU loads at Open (cuda.KernelInfos, no GPU
// needed), or the CUDA host device's programs (a cuda device with engine
// cpu). ok is false for a backend with no list.
func programNames(dev *Device) (names []string, ok bool) {
	switch {
	case dev.Backend == BackendSim:
		return sim.Kernels(), true
	case dev.Backend == BackendCUDA && dev.Engine == hw.EngineCPU:
		return cuda.HostPrograms(), true
	case dev.Backend == BackendCUDA && dev.Engine == hw.EngineGPU:
		infos := cuda.KernelInfos()
		names = make([]string, len(infos))
		for i, k := range infos {
			names[i] = k.Name
		}
		return names, true
	}
	return nil, false
}

// maxListedPrograms is the most program names an unknown-program error
// lists; a backend with more (the op library's) is named by its count.
const maxListedPrograms = 16

// noProgram reports a program name that dev's backend does not have and
// no [[kernel]] has, suggesting a close one among both (kernels: the
// manifest's kernel names), or else listing the backend's programs (or,
// when there are more than maxListedPrograms, counting them).
func (d *decoder) noProgram(p keyPath, name string, dev *Device, known, kernels []string) {
	on := "backend " + string(dev.Backend)
	if dev.Backend == BackendCUDA && dev.Engine == hw.EngineCPU {
		on = "the cuda host device (engine cpu)"
	}
	msg := fmt.Sprintf("no program %q on %s", name, on)
	switch s := suggest(name, append(slices.Clip(known), kernels...)); {
	case s != "":
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	case len(known) > maxListedPrograms:
		msg += fmt.Sprintf(" (it has %d programs: `stagehost kernels` lists them)", len(known))
	default:
		msg += fmt.Sprintf(" (it has %s)", strings.Join(known, ", "))
	}
	d.errorf(p, "%s", msg)
}

func (d *decoder) checkFaults(m *Manifest, devs []devMeta, sess []sessMeta) {
	for i, dev := range m.Devices {
		if dev.Sim == nil {
			continue
		}
		for j, f := range dev.Sim.Faults {
			meta := devs[i].faults[j]
			if meta.p == nil || !meta.kind {
				continue
			}
			if meta.counts && !f.Kind.Counted() {
				d.errorf(meta.p.key("count"), "count applies only to reject, fail_completion and fail_visibility faults, not to %q", f.Kind)
			}
			if !meta.session || f.Session == "" {
				continue
			}
			p := meta.p.key("session")
			if f.Kind.DeviceWide() {
				d.errorf(p, "a %q fault always affects the whole device; it cannot be limited to a session", f.Kind)
				continue
			}
			k, s := lookup(m.Sessions, f.Session, sessionName)
			switch {
			case s == nil && m.Resident(f.Session) != nil:
				d.errorf(p, "%q is a resident session: a fault can only target a [[session]]", f.Session)
			case s == nil:
				d.notFound(p, "session", f.Session, namesOf(m.Sessions, sessionName))
			case sess[k].device && devs[i].name && !slices.Contains(s.Devices, dev.Name):
				d.errorf(p, "session %q runs on %s, not on %q", f.Session, quotedList(s.Devices), dev.Name)
			}
		}
	}
}

func (d *decoder) checkResidents(m *Manifest, devs []devMeta, res []resMeta) {
	devices := namesOf(m.Devices, deviceName)
	for i, r := range m.Residents {
		meta := res[i]
		if meta.p == nil {
			continue
		}
		var gpu, npu *Device // set where the backend decoded
		if meta.gpu {
			gpu = d.residentGPU(m, devs, meta.p.key("gpu"), r.GPU, devices)
		}
		if meta.npu {
			npu = d.residentNPU(m, devs, meta.p.key("npu"), r.NPU, devices)
		}
		if gpu != nil && npu != nil && gpu.Backend != npu.Backend {
			d.errorf(meta.p.key("npu"), "device %q is a %s device and gpu %q a %s one: a resident's gpu and npu must both be sim or both cuda devices",
				r.NPU, npu.Backend, r.GPU, gpu.Backend)
			continue
		}
		// The participants of both backends (exchange.NewSimExchange,
		// exchange.NewCUDAExchange) exchange exactly exchange.PayloadSize
		// bytes; the host refuses any other payload when the run starts.
		if backend := residentBackend(gpu, npu); backend != "" && meta.payload && r.Payload != exchange.PayloadSize {
			d.errorf(meta.p.key("payload"), "the %s resident participants exchange exactly %s (16 float32 values and both sides' credit words), not %s",
				backend, FormatSize(exchange.PayloadSize), FormatSize(r.Payload))
		}
	}
}

// residentGPU: a resident's gpu (named at p) is a device with engine gpu.
// It returns the device where its backend decoded, else nil.
func (d *decoder) residentGPU(m *Manifest, devs []devMeta, p keyPath, name string, devices []string) *Device {
	j, dev := lookup(m.Devices, name, deviceName)
	switch {
	case dev == nil:
		d.notFound(p, "device", name, devices)
	case devs[j].engine && dev.Engine != hw.EngineGPU:
		d.errorf(p, "device %q has engine %s: gpu must name a device with engine gpu", name, dev.Engine)
	case devs[j].backend:
		return dev
	}
	return nil
}

// residentNPU: a resident's npu (named at p) is a device with engine npu,
// or cpu as a stand-in. It returns the device where its backend decoded,
// else nil.
func (d *decoder) residentNPU(m *Manifest, devs []devMeta, p keyPath, name string, devices []string) *Device {
	j, dev := lookup(m.Devices, name, deviceName)
	switch {
	case dev == nil:
		d.notFound(p, "device", name, devices)
	case devs[j].engine && dev.Engine != hw.EngineNPU && dev.Engine != hw.EngineCPU:
		d.errorf(p, "device %q has engine %s: npu must name a device with engine npu (or cpu, as a stand-in)", name, dev.Engine)
	case devs[j].backend:
		return dev
	}
	return nil
}

// residentBackend is the backend of a resident's devices, or "" when
// neither is known.
func residentBackend(gpu, npu *Device) Backend {
	switch {
	case gpu != nil:
		return gpu.Backend
	case npu != nil:
		return npu.Backend
	}
	return ""
}

func (d *decoder) checkDeviceMemory(m *Manifest, devs []devMeta, sess []sessMeta, res []resMeta) {
	for i, dev := range m.Devices {
		if devs[i].p == nil || !devs[i].name || !devs[i].sz || dev.Memory == 0 {
			continue
		}
		type charge struct {
			who  string
			size int64
		}
		var charges []charge
		var sum int64
		for k, s := range m.Sessions {
			if sess[k].p != nil && sess[k].bytes && s.Device == dev.Name {
				charges = append(charges, charge{"session " + strconv.Quote(s.Name), s.Budget})
				sum = addSat(sum, s.Budget)
			}
		}
		for k, r := range m.Residents {
			if res[k].p != nil && res[k].budgeted && (r.GPU == dev.Name || r.NPU == dev.Name) {
				charges = append(charges, charge{"resident " + strconv.Quote(r.Name), r.Budget})
				sum = addSat(sum, r.Budget)
			}
		}
		// Weights are charged once per device, whatever the number of
		// sessions and instances that share them.
		for _, w := range m.Weights {
			if weightsUsedOn(m, w.Name, dev.Name) {
				charges = append(charges, charge{"weights " + strconv.Quote(w.Name), w.DataSize})
				sum = addSat(sum, w.DataSize)
			}
		}
		if sum <= dev.Memory {
			continue
		}
		sort.SliceStable(charges, func(a, b int) bool { return charges[a].size > charges[b].size })
		parts := make([]string, len(charges))
		for k, c := range charges {
			parts[k] = fmt.Sprintf("%s %s", c.who, FormatSize(c.size))
		}
		d.errorf(devs[i].p.key("memory"), "the budgets on device %q sum to %s, above its memory of %s (%s)",
			dev.Name, FormatSize(sum), FormatSize(dev.Memory), strings.Join(parts, ", "))
	}
}

// quotedList writes names as `device "a"` or `devices "a", "b"`.
func quotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	if len(q) == 1 {
		return "device " + q[0]
	}
	return "devices " + strings.Join(q, ", ")
}
