-- commit.lua: mark KEYS[1] processed if ARGV[2] still owns its claim.
--
-- ARGV[1] now, ms, decimal (not compared: the token decides)
-- ARGV[2] owner token
-- ARGV[3] completed_at (now), base 36
-- ARGV[4] expires_at (now + window), base 36
-- ARGV[5] window, ms (TTL backstop)
-- ARGV[6] result part (status, response), opaque here
-- ARGV[7] the claim's first_seen, base 36, when the caller made the claim
--         (else empty)
-- ARGV[8] the claim's attempts
-- ARGV[9] the claim's claim part (body SHA-256, fingerprint), opaque here
--
-- Returns 1 when committed (also when this same call is repeated by a client
-- retry), 0 when the caller is not the owner (nothing changed).
--
-- An absent key with ARGV[7] set is a claim the store lost (written to a
-- master a failover discarded, or evicted): no other owner exists, and the
-- event was processed, so it is recorded from ARGV[7..9]. A forgotten lease
-- is not absent: forget.lua leaves a tombstone ('t') for the rest of its
-- TTL, and the owner's commit finds it below, not ours.
local rec = redis.call('GET', KEYS[1])
if not rec then
  if ARGV[7] == '' then
    return 0
  end
  redis.call('SET', KEYS[1],
    'd,' .. ARGV[7] .. ',' .. ARGV[4] .. ',' .. ARGV[8] .. ',' .. ARGV[3] .. ',' ..
    #ARGV[9] .. ',' .. ARGV[9] .. ARGV[6],
    'PX', ARGV[5])
  return 1
end
local st, fs, exp, att, aux, clen, pos =
  string.match(rec, '^(%a),(%w+),(%w+),(%d+),(%w*),(%d+),()')
if not st then
  return redis.error_reply('ERR dedupgw: undecodable record')
end
if st == 'd' and aux == ARGV[3] and exp == ARGV[4] and
    string.sub(rec, pos + tonumber(clen)) == ARGV[6] then
  -- Exactly what this call writes is already in place, to the millisecond:
  -- the client re-sent the call after a lost reply.
  return 1
end
-- The token decides, not the lease: a claim whose lease ran out still
-- belongs to its owner until another claim replaced the token (the record
-- is kept for the lease plus dedup.LeaseGrace).
if st ~= 'p' or aux ~= ARGV[2] then
  return 0
end
local claim = string.sub(rec, pos, pos + tonumber(clen) - 1)
redis.call('SET', KEYS[1],
  'd,' .. fs .. ',' .. ARGV[4] .. ',' .. att .. ',' .. ARGV[3] .. ',' ..
  clen .. ',' .. claim .. ARGV[6],
  'PX', ARGV[5])
return 1
