-- claim.lua: take KEYS[1] for one attempt, or report why not, in one round trip.
-- It runs after result.lua (uvarint, markIndex), which store.go puts in front.
--
-- On Redis >= 7.0 most claims do not get here: the Store first sends
-- SET KEYS[1] <new record> NX GET PX ARGV[4] (the fast path, claim.go), which
-- claims an absent key with exactly the record written below, and decides a
-- live processed record, a live lease and a fingerprint conflict in Go with
-- claimDecision, the same rule as below for the cases that change nothing.
-- This script runs for the rest (a lapsed lease or a failed record to take
-- over, an expired record, anything unusual) and for every claim when the
-- server refused SET NX GET. It stays the one place that writes over an
-- existing record: change its rule and claimDecision together.
--
-- ARGV[1] now, ms since the Unix epoch, decimal (the caller's clock)
-- ARGV[2] now, base 36 (first_seen of a new record)
-- ARGV[3] lease_until, base 36
-- ARGV[4] the key's TTL, ms: the lease plus a grace period during which a
--         lapsed claim's history survives (a garbage-collection backstop
--         only; every decision compares the record's own times with ARGV[1])
-- ARGV[5] owner token
-- ARGV[6] claim part (body SHA-256, fingerprint), opaque here
-- ARGV[7] the fingerprint field of ARGV[6] to bind the key to, or empty
--
-- Record: state,first_seen,expires_at,attempts,aux,claim_len,<claim><result>
-- (see record.go). Returns {0, new record} when claimed, {4, new record}
-- when claimed by taking over a lapsed lease, {1, record} for a
-- processed key inside its window, {2, record} for a held lease, {3, record}
-- when ARGV[7] is set and the live record is bound to another non-empty
-- fingerprint (nothing changes). A call repeated with the same owner token
-- (a client retry after a lost reply) returns {0, record} again, so a retry
-- never turns a claim into in-flight.

-- fingerprint returns the fingerprint field of a claim part: what follows
-- the body field (tag 0 empty, 1 + 32 bytes, 2 + uvarint length + bytes).
local function fingerprint(claim)
  local i, tag = 2, string.byte(claim, 1)
  if tag == 1 then
    i = 34
  elseif tag == 2 then
    local n
    n, i = uvarint(claim, 2)
    i = i + n
  end
  return string.sub(claim, i)
end

-- marked returns a processing record's result part (empty, or last_status,
-- last_error and the maybe-processed tag 0x02; never a response) with the
-- tag: the attempt whose lease lapsed ended unseen, and the application
-- may have processed it.
local function marked(result)
  if result == '' then
    return '\0\0\2'
  end
  local i = markIndex(result)
  if not i or string.byte(result, i) == 2 then
    return result
  end
  return string.sub(result, 1, i - 1) .. '\2' .. string.sub(result, i)
end

local rec = redis.call('GET', KEYS[1])
local now = tonumber(ARGV[1])
local first, attempts, result, code = ARGV[2], 0, '', 0
if rec then
  local st, fs, exp, att, aux, clen, pos =
    string.match(rec, '^(%a),(%w+),(%w+),(%d+),(%w*),(%d+),()')
  if not st then
    return redis.error_reply('ERR dedupgw: undecodable record')
  end
  -- A record is expired once now is past its expires_at.
  local live = tonumber(exp, 36) >= now
  local lapsed = st == 'p' and not live
  if ARGV[7] ~= '' and (live or lapsed) and aux ~= ARGV[5] then
    local fp = fingerprint(string.sub(rec, pos, pos + tonumber(clen) - 1))
    if fp ~= '' and fp ~= '\0' and fp ~= ARGV[7] then
      return {3, rec}
    end
  end
  if live and st == 'd' then
    return {1, rec}
  elseif live and st == 'p' then
    if aux == ARGV[5] then
      -- Our own claim: the client re-sent this call after a lost reply.
      return {0, rec}
    end
    return {2, rec}
  end
  if lapsed or (st == 'f' and live) then
    -- A lapsed lease (a crashed or stuck attempt) or a retained failure:
    -- claimable, and the receipt's history (first_seen, attempts, last
    -- status and error, the maybe-processed mark) carries over; a lapsed
    -- lease sets the mark. An expired processed or failed
    -- record is absent: the key starts over.
    first, attempts = fs, tonumber(att)
    result = string.sub(rec, pos + tonumber(clen))
    if lapsed then
      result, code = marked(result), 4
    end
  end
end
local new = 'p,' .. first .. ',' .. ARGV[3] .. ',' .. (attempts + 1) .. ',' ..
  ARGV[5] .. ',' .. #ARGV[6] .. ',' .. ARGV[6] .. result
redis.call('SET', KEYS[1], new, 'PX', ARGV[4])
return {code, new}
