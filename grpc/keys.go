package pglimitgrpc

import (
	"context"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/pglimit/pglimit/clientaddr"
)

// ClientAddr returns a KeyFunc counting a call against its client's
// address: the peer's (peer.FromContext), or, when r trusts the peer as a
// proxy, the address it forwarded in the one metadata header r reads
// (x-forwarded-for by default, or forwarded), normalised as package
// clientaddr says (IPv6 by prefix). r nil is a Resolver trusting no proxy:
// the peer's address. A call whose peer is not an IP address (a Unix
// socket, an in-process listener) has no key and passes uncounted; a call
// from a trusted proxy whose header names no client address is refused
// InvalidArgument (clientaddr.ErrUnreadable), counted nowhere.
func ClientAddr(r *clientaddr.Resolver) KeyFunc {
	if r == nil {
		r, _ = clientaddr.New(clientaddr.Options{}) // the defaults are valid
	}
	return func(ctx context.Context) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", nil
		}
		md, _ := metadata.FromIncomingContext(ctx)
		return r.Key(p.Addr.String(), mdHeader(md))
	}
}

// mdHeader is gRPC metadata as a clientaddr.Header.
type mdHeader metadata.MD

func (h mdHeader) Values(key string) []string { return metadata.MD(h).Get(key) }

// MetadataKey returns a KeyFunc counting a call against the first value of
// its incoming metadata name ("x-tenant-id"); a call without it passes
// uncounted. The value is stored as it is: use it for identities that are
// not secrets (an id an authentication interceptor put in the metadata,
// a tenant); for a raw API token write a KeyFunc returning
// inflight.TokenKey of it, or the token's id.
func MetadataKey(name string) KeyFunc {
	return func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if vs := md.Get(name); len(vs) > 0 {
			return vs[0], nil
		}
		return "", nil
	}
}
