package signin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Defaults of DeviceOptions.
const (
	// defaultDeviceCookie has the __Host- prefix: a browser takes such a
	// cookie only from this host itself, Secure, with Path "/" and no
	// Domain, so a sibling subdomain cannot plant cookies of the name that
	// hide the real one (cookie tossing).
	defaultDeviceCookie = "__Host-pglimit_device"
	// maxDeviceCookies is how many cookies of a username's name a request's
	// are checked: more than a browser keeps of one name.
	maxDeviceCookies    = 16
	defaultDeviceMaxAge = 30 * 24 * time.Hour
	// minDeviceKey is the shortest key DeviceOptions.Keys takes: the
	// HMAC-SHA256 key a brute force cannot reach.
	minDeviceKey = 32
	// maxDeviceKeys bounds the keys a cookie is checked against.
	maxDeviceKeys = 8
)

// The wire form of a device cookie: version, expiry (Unix seconds), the
// device's id and a truncated HMAC-SHA256 over the username and all of it.
const (
	deviceVersion = 1
	deviceIDLen   = 16
	deviceTagLen  = 16
	deviceLen     = 1 + 8 + deviceIDLen + deviceTagLen
)

// DeviceOptions configure Devices.
type DeviceOptions struct {
	// Keys sign and verify the cookies: Keys[0] signs every new cookie and
	// every key verifies one, so a key is rotated by putting the new one
	// first and keeping the old one until MaxAge has passed (its cookies
	// then lapse). Each key is at least 32 random bytes, at most 8 keys;
	// every replica of a service must have the same keys (a cookie another
	// replica set is checked here). Required.
	Keys [][]byte
	// MaxAge is how long a cookie is good after the successful sign-in
	// that set it; each successful sign-in with it sets it again for as
	// long. Default 30 days.
	MaxAge time.Duration
	// CookieName is the prefix of the cookies' names: one cookie per
	// username a browser signed in as, named this, "_" and 12 hex digits of
	// the username's SHA-256. Default "__Host-pglimit_device" (a name a
	// browser takes only from this very host, so that another subdomain
	// cannot plant cookies of the name).
	CookieName string
}

// Devices are the device cookies of the sign-in throttle, after OWASP's
// "Slow Down Online Guessing Attacks with Device Cookies": a successful
// sign-in leaves the client a cookie, signed with a key every replica
// shares, naming a device of its username; a client that presents it is a
// device the user signed in from before. A username's throttle over every
// client address (Scope "username") does not count or refuse such a
// client, so an attacker who fails for the username from anywhere cannot
// lock its owner out of the devices she uses; and the throttle per pair
// (Scope "pair") counts her failures per device rather than per address,
// so a cookie that fails the pair's Limit is itself locked out, as an
// address would be. A cookie is checked in memory, without a statement:
// its HMAC, its username and its expiry.
//
// A cookie is HttpOnly, Secure and SameSite=Strict, Path "/". Share one
// Devices between the Limiters of a sign-in route. It is safe for
// concurrent use.
type Devices struct {
	keys   [][]byte
	maxAge time.Duration
	name   string
	now    func() time.Time
}

// NewDevices returns the device cookies of opts, checked once, here: no
// key, a key shorter than 32 bytes, more than 8 keys, a negative MaxAge or
// a CookieName that is no cookie name is an error naming the field.
func NewDevices(opts DeviceOptions) (*Devices, error) {
	if len(opts.Keys) == 0 {
		return nil, errors.New("signin: DeviceOptions.Keys: at least one key is required")
	}
	if len(opts.Keys) > maxDeviceKeys {
		return nil, fmt.Errorf("signin: DeviceOptions.Keys: %d keys, at most %d", len(opts.Keys), maxDeviceKeys)
	}
	d := &Devices{maxAge: opts.MaxAge, name: opts.CookieName, now: time.Now}
	for i, k := range opts.Keys {
		if len(k) < minDeviceKey {
			return nil, fmt.Errorf("signin: DeviceOptions.Keys[%d]: %d bytes, at least %d", i, len(k), minDeviceKey)
		}
		d.keys = append(d.keys, append([]byte(nil), k...))
	}
	switch {
	case d.maxAge < 0:
		return nil, fmt.Errorf("signin: DeviceOptions.MaxAge %v is negative", d.maxAge)
	case d.maxAge == 0:
		d.maxAge = defaultDeviceMaxAge
	}
	if d.name == "" {
		d.name = defaultDeviceCookie
	}
	if c := (&http.Cookie{Name: d.name + "_0", Value: "x"}); c.Valid() != nil || strings.ContainsAny(d.name, "=;, \t") {
		return nil, fmt.Errorf("signin: DeviceOptions.CookieName %q is not a cookie name", opts.CookieName)
	}
	return d, nil
}

// device is the device a request's cookie names, when it is valid.
type device struct {
	id    [deviceIDLen]byte
	valid bool
}

// cookieName is the name of username's cookie.
func (d *Devices) cookieName(username string) string {
	sum := sha256.Sum256([]byte("pglimit device cookie\x00" + username))
	return d.name + "_" + hex.EncodeToString(sum[:6])
}

// tag is the HMAC of a cookie's fields under key.
func deviceTag(key []byte, username string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("pglimit device v1\x00"))
	m.Write([]byte(username))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)[:deviceTagLen]
}

// check returns the device of r's cookie for username (the normalised
// username), valid when its tag verifies under one of the keys and it
// has not expired. It reads at most maxDeviceCookies cookies of that name.
func (d *Devices) check(r *http.Request, username string) device {
	if d == nil || username == "" {
		return device{}
	}
	name := d.cookieName(username)
	seen := 0
	for _, c := range r.CookiesNamed(name) {
		if seen++; seen > maxDeviceCookies {
			break
		}
		if dev, ok := d.verify(c.Value, username); ok {
			return dev
		}
	}
	return device{}
}

// verify reads one cookie value of username.
func (d *Devices) verify(value, username string) (device, bool) {
	if len(value) != base64.RawURLEncoding.EncodedLen(deviceLen) {
		return device{}, false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(value)
	if err != nil || len(b) != deviceLen || b[0] != deviceVersion {
		return device{}, false
	}
	body, tag := b[:deviceLen-deviceTagLen], b[deviceLen-deviceTagLen:]
	ok := false
	for _, k := range d.keys {
		// Every key is tried, so the time taken says nothing of which.
		if hmac.Equal(deviceTag(k, username, body), tag) {
			ok = true
		}
	}
	if !ok {
		return device{}, false
	}
	exp := int64(binary.BigEndian.Uint64(body[1:9]))
	if exp <= d.now().Unix() {
		return device{}, false
	}
	var dev device
	copy(dev.id[:], body[9:9+deviceIDLen])
	dev.valid = true
	return dev, true
}

// issue sets username's cookie on h: the device dev names again (its
// expiry renewed) when it is valid, a new device otherwise.
func (d *Devices) issue(h http.Header, username string, dev device) {
	if !dev.valid {
		if _, err := rand.Read(dev.id[:]); err != nil {
			return // no cookie: the client is counted as one without
		}
	}
	exp := d.now().Add(d.maxAge)
	body := make([]byte, 0, deviceLen)
	body = append(body, deviceVersion)
	body = binary.BigEndian.AppendUint64(body, uint64(exp.Unix()))
	body = append(body, dev.id[:]...)
	body = append(body, deviceTag(d.keys[0], username, body)...)
	c := &http.Cookie{
		Name:     d.cookieName(username),
		Value:    base64.RawURLEncoding.EncodeToString(body),
		Path:     "/",
		Expires:  exp.UTC(),
		MaxAge:   int(d.maxAge / time.Second),
		Secure:   true,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
	}
	h.Add("Set-Cookie", c.String())
}

// idText is the device's id as a key holds it.
func (dev device) idText() string { return hex.EncodeToString(dev.id[:]) }
