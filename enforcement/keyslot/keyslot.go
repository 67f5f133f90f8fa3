// Package keyslot computes Redis Cluster hash slots, so that the limiter can
// say which shard holds a key (hot-key visibility, per-shard breakers)
// without asking Redis.
package keyslot

import "github.com/ratewarden/ratewarden/limits"

// Slot is the Redis Cluster hash slot (0–16383) of a Redis key: CRC16
// (XMODEM) of the key's hash tag — the part between the first "{" and the
// next "}", when that is not empty — or of the whole key, modulo 16384.
func Slot(redisKey string) uint16 {
	s := redisKey
	for i := 0; i < len(s); i++ {
		if s[i] == '{' {
			for j := i + 1; j < len(s); j++ {
				if s[j] == '}' {
					if j > i+1 {
						s = s[i+1 : j]
					}
					break
				}
			}
			break
		}
	}
	return crc16(s) % Count
}

// Count is the number of Redis Cluster hash slots.
const Count = 16384

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}

// BucketKey is the Redis key of the bucket of (key, scope) under prefix,
// "<prefix>:{key}:b2:scope" (redisstore's layout, in one place: "b2" is the
// bucket's second stored form, see redisstore's state.lua). The rate-limit
// key is the hash tag, so all of one key's buckets and quota counters share
// a Cluster slot.
func BucketKey(prefix, key, scope string) string {
	return prefix + ":{" + key + "}:b2:" + scope
}

// ReservationKey is the Redis key of the record of reservation id on
// key's buckets, "<prefix>:{key}:r:id": the same hash tag as BucketKey, so
// the record and its bucket share a Cluster slot and one script.
func ReservationKey(prefix, key, id string) string {
	return prefix + ":{" + key + "}:r:" + id
}

// ReservationIndexKey is the Redis key of the index of key's open
// reservations, "<prefix>:{key}:rs": a sorted set of reservation ids
// scored by when their records expire (unix ms). The scripts that write
// a record find the index from the record's key (redisstore's state.lua,
// reservation_index: its agreement with these two is tested), so a
// reservation and its entry are written, and a settle removes both,
// atomically.
func ReservationIndexKey(prefix, key string) string {
	return prefix + ":{" + key + "}:rs"
}

// SlotSetKey is the Redis key of the slots held on (key, scope)'s
// concurrency limit, "<prefix>:{key}:c:scope": the same hash tag as
// BucketKey, so a key's slots and its buckets share a Cluster slot.
func SlotSetKey(prefix, key, scope string) string {
	return prefix + ":{" + key + "}:c:" + scope
}

// KeySlot is the hash slot of the bucket of (key, scope) (BucketKey, with
// limits.DefaultKeyPrefix): the hash tag is the rate-limit key up to its
// first "}" (the whole Redis key when that leaves the tag empty). It does
// not allocate.
func KeySlot(key, scope string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '}' {
			if i == 0 {
				return Slot(BucketKey(limits.DefaultKeyPrefix, key, scope))
			}
			return crc16(key[:i]) % Count
		}
	}
	return crc16(key) % Count
}

// ResetLogKey is the Redis key of the audit of key's support resets,
// "<prefix>:{key}:resets": a list, newest first, in the key's slot so that
// a reset and its audit record are one script.
func ResetLogKey(prefix, key string) string {
	return prefix + ":{" + key + "}:resets"
}

// ResetMarkKey is the Redis key that marks reset id as applied to key,
// "<prefix>:{key}:reset:id": a reset sent twice is applied once.
func ResetMarkKey(prefix, key, id string) string {
	return prefix + ":{" + key + "}:reset:" + id
}

// ResetChannel is the pub/sub channel a reset is announced on, so that
// every limiter on the store drops its local view of the key.
func ResetChannel(prefix string) string { return prefix + ":resets" }
