-- forget.lua: delete KEYS[1] if its record meets the forget's conditions.
--
-- ARGV[1] now, ms, decimal
-- ARGV[2] the state letter the record must be in, or "" for any state
-- ARGV[3] "1" keeps a processing record (a delivery in flight), else "0"
--
-- Returns {0} when the key was absent or its record had already expired by
-- the caller's clock (it is deleted anyway), {1, record} when the record was
-- deleted, and {2, record} when it was kept because it does not meet the
-- conditions. A record this script cannot parse is deleted unless ARGV[2]
-- names a state (the way to repair a key), else kept: ARGV[3] does not keep
-- it, since claim.lua refuses such a record, so no delivery holds the key.
local rec = redis.call('GET', KEYS[1])
if not rec then
  return {0}
end
local state, exp = string.match(rec, '^(%a),%w+,(%w+),')
if exp and tonumber(exp, 36) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return {0}
end
if (ARGV[2] ~= '' and state ~= ARGV[2]) or (ARGV[3] == '1' and state == 'p') then
  return {2, rec}
end
redis.call('DEL', KEYS[1])
return {1, rec}
