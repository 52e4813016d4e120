package signin

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestDeviceCookieLifetimeAndRotation: a cookie is good until its MaxAge
// and not a second after; a key is rotated by putting the new one first:
// a cookie the old key signed is good while the old key is kept, and not
// once it is dropped; the new key signs; a cookie is one username's; a
// cookie value of the wrong length, alphabet or version is none.
func TestDeviceCookieLifetimeAndRotation(t *testing.T) {
	t.Parallel()
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mk := func(keys ...[]byte) *Devices {
		d, err := NewDevices(DeviceOptions{Keys: keys, MaxAge: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		d.now = clock
		return d
	}
	old := mk(oldKey)
	h := http.Header{}
	old.issue(h, "carol", device{})
	cookie := (&http.Response{Header: h}).Cookies()[0]
	check := func(d *Devices, username string, c *http.Cookie) bool {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.AddCookie(c)
		return d.check(r, username).valid
	}
	if !check(old, "carol", cookie) {
		t.Fatal("a fresh cookie is not valid")
	}
	if check(old, "alice", &http.Cookie{Name: old.cookieName("alice"), Value: cookie.Value}) {
		t.Error("carol's cookie is good for alice")
	}
	rotated, dropped := mk(newKey, oldKey), mk(newKey)
	if !check(rotated, "carol", cookie) {
		t.Error("a cookie of the old key is refused while the old key is kept")
	}
	if check(dropped, "carol", cookie) {
		t.Error("a cookie of a dropped key is good")
	}
	h2 := http.Header{}
	rotated.issue(h2, "carol", rotated.check(requestWith(cookie), "carol"))
	renewed := (&http.Response{Header: h2}).Cookies()[0]
	if !check(dropped, "carol", renewed) || check(old, "carol", renewed) {
		t.Error("the new key does not sign, or the old one still does")
	}
	if a, b := old.check(requestWith(cookie), "carol"), dropped.check(requestWith(renewed), "carol"); a.id != b.id {
		t.Error("a renewed cookie names another device")
	}
	now = now.Add(time.Hour - time.Second)
	if !check(old, "carol", cookie) {
		t.Error("a cookie a second before its MaxAge is refused")
	}
	now = now.Add(time.Second)
	if check(old, "carol", cookie) {
		t.Error("a cookie at its MaxAge is good")
	}
	now = now.Add(-time.Hour)
	for _, v := range []string{"", "x", cookie.Value + "A", cookie.Value[:len(cookie.Value)-1], "!" + cookie.Value[1:],
		"Ag" + cookie.Value[2:]} {
		if check(old, "carol", &http.Cookie{Name: cookie.Name, Value: v}) {
			t.Errorf("cookie value %q is good", v)
		}
	}
}

func requestWith(c *http.Cookie) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.AddCookie(c)
	return r
}
