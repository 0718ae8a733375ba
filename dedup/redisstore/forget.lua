-- forget.lua: forget KEYS[1] whatever its state.
--
-- ARGV[1] now, ms, decimal
-- ARGV[2] the grace a lapsed lease's record is kept for, ms (claim.lua's TTL
--         is the lease plus this)
--
-- A processing record (a lease) becomes a tombstone, 't,0,0,0,,0,' (see
-- record.go), for as long as the record would have lived (no PTTL: the ACL
-- the README gives does not allow it): absent to Get and to claims (it
-- expired at 0), it tells the lease's owner at commit that the key was
-- forgotten, not lost (commit.lua). Any other record is deleted; a tombstone
-- stays.
--
-- Returns 1 when an unexpired record was forgotten, 0 when the key was absent
-- (or a tombstone) or its record had already expired by the caller's clock
-- (it is forgotten anyway).
local rec = redis.call('GET', KEYS[1])
if not rec then
  return 0
end
local st = string.sub(rec, 1, 1)
if st == 't' then
  return 0
end
local exp = string.match(rec, '^%a,%w+,(%w+),')
local left = exp and (tonumber(exp, 36) - tonumber(ARGV[1])) -- ms to expiry
if st == 'p' and left and left + tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], 't,0,0,0,,0,', 'PX', left + tonumber(ARGV[2]))
else
  redis.call('DEL', KEYS[1])
end
if left and left < 0 then
  return 0
end
return 1
