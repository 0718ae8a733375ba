-- forget.lua: delete KEYS[1] whatever its state.
--
-- ARGV[1] now, ms, decimal
--
-- Returns 1 when an unexpired record was deleted, 0 when the key was absent or
-- its record had already expired by the caller's clock (it is deleted anyway).
local rec = redis.call('GET', KEYS[1])
if not rec then
  return 0
end
redis.call('DEL', KEYS[1])
local exp = string.match(rec, '^%a,%w+,(%w+),')
if exp and tonumber(exp, 36) < tonumber(ARGV[1]) then
  return 0
end
return 1
