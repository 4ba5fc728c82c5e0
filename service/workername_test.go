package service_test

import (
	"strings"
	"testing"

	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// TestSupervisedWorkerNameErrors: a tenant worker DEVICE-TENANT may not be
// named like a device, nor like another tenant worker; tenants without a
// session on a device have no worker there.
func TestSupervisedWorkerNameErrors(t *testing.T) {
	m := &manifest.Manifest{
		Devices: []manifest.Device{{Name: "a"}, {Name: "a-b"}, {Name: "z"}},
		Sessions: []manifest.Session{
			{Name: "s1", Devices: []string{"a"}, Tenant: "b"},
			{Name: "s2", Devices: []string{"a"}, Tenant: "b-c"},
			{Name: "s3", Devices: []string{"a-b"}, Tenant: "c"},
			{Name: "s4", Devices: []string{"z"}, Tenant: "q"},
		},
	}
	got := strings.Join(service.SupervisedWorkerNameErrors(m), "\n")
	want := strings.Join([]string{
		`the worker of device "a" and tenant "b" would be named "a-b", a device's name`,
		`the worker of device "a-b" and tenant "c" would be named "a-b-c", as the worker of device "a" and tenant "b-c"`,
	}, "\n")
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	m.Sessions = m.Sessions[3:]
	if bad := service.SupervisedWorkerNameErrors(m); len(bad) != 0 {
		t.Fatalf("no collision: %v", bad)
	}
}
