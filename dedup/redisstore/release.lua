-- release.lua: mark KEYS[1] failed (claimable) if ARGV[2] still owns its
-- claim.
--
-- ARGV[1] now, ms, decimal (not compared: the token decides)
-- ARGV[2] owner token
-- ARGV[3] completed_at, base 36: now, or the first try's time when the
--         caller tries again (a repeat is told by it, see below)
-- ARGV[4] expires_at (now + retain), base 36
-- ARGV[5] retain, ms (TTL backstop); 0 deletes the key at once
-- ARGV[6] result part (status, error), opaque here
--
-- Returns 1 when released (also when this same call is repeated by a client
-- retry), 0 when the caller is not the owner (nothing changed).
local rec = redis.call('GET', KEYS[1])
if not rec then
  return 0
end
local st, fs, exp, att, aux, clen, pos =
  string.match(rec, '^(%a),(%w+),(%w+),(%d+),(%w*),(%d+),()')
if not st then
  return redis.error_reply('ERR dedupgw: undecodable record')
end
if st == 'f' and aux == ARGV[3] and
    string.sub(rec, pos + tonumber(clen)) == ARGV[6] then
  -- What this call writes is already in place, with its completed_at to
  -- the millisecond: the client re-sent the call after a lost reply, or
  -- its caller tried it again later (with a later expires_at, not compared).
  return 1
end
-- The token decides, not the lease: a claim whose lease ran out still
-- belongs to its owner until another claim replaced the token (the record
-- is kept for the lease plus dedup.LeaseGrace).
if st ~= 'p' or aux ~= ARGV[2] then
  return 0
end
if tonumber(ARGV[5]) <= 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
local claim = string.sub(rec, pos, pos + tonumber(clen) - 1)
redis.call('SET', KEYS[1],
  'f,' .. fs .. ',' .. ARGV[4] .. ',' .. att .. ',' .. ARGV[3] .. ',' ..
  clen .. ',' .. claim .. ARGV[6],
  'PX', ARGV[5])
return 1
