-- forget.lua: delete KEYS[1] if its record meets the forget's conditions.
-- It runs after result.lua (markIndex), which store.go puts in front.
--
-- ARGV[1] now, ms, decimal
-- ARGV[2] the state letter the record must be in, or "" for any state
-- ARGV[3] "1" keeps a processing record (a delivery in flight), else "0"
-- ARGV[4] "1" keeps a record marked maybe processed, else "0"
--
-- Returns {0} when the key was absent or its record had already expired by
-- the caller's clock (it is deleted anyway), {1, record} when the record was
-- deleted, and {2, record} when it was kept because it does not meet the
-- conditions. A record this script cannot parse is deleted unless ARGV[2]
-- names a state (the way to repair a key), else kept: ARGV[3] does not keep
-- it, since claim.lua refuses such a record, so no delivery holds the key.
-- maybeProcessed reports whether the result part of rec (see record.go:
-- uvarint last_status, uvarint length, last_error, then 0x02 when marked)
-- carries the maybe-processed mark.
local function maybeProcessed(rec)
  local clen, pos = string.match(rec, '^%a,%w+,%w+,%d+,%w*,(%d+),()')
  if not clen then
    return false
  end
  local result = string.sub(rec, pos + tonumber(clen))
  local i = markIndex(result)
  return i ~= nil and string.byte(result, i) == 2
end

local rec = redis.call('GET', KEYS[1])
if not rec then
  return {0}
end
local state, exp = string.match(rec, '^(%a),%w+,(%w+),')
if exp and tonumber(exp, 36) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return {0}
end
if (ARGV[2] ~= '' and state ~= ARGV[2]) or (ARGV[3] == '1' and state == 'p') or
    (ARGV[4] == '1' and maybeProcessed(rec)) then
  return {2, rec}
end
redis.call('DEL', KEYS[1])
return {1, rec}
