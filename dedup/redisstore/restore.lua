-- restore.lua: put back the value a fast commit (commit.go) wrote over,
-- if KEYS[1] still holds what that commit wrote.
--
-- ARGV[1] the record the commit's SET wrote
-- ARGV[2] the value that SET replaced
-- ARGV[3] that value's remaining life, ms; 0 when it is not known (a value
--         that is not a record): the key keeps the TTL the SET gave it
-- ARGV[4] "1" when ARGV[2] is a processing record (a lease), else "0": a
--         lease is put back into an absent key too, since what deleted the
--         key in between (a forget, which keeps or deletes processing
--         records but read this commit's as processed) meant the record
--         the commit wrote, not the lease
--
-- Returns 1 when put back, 0 when the key holds something else by now
-- (nothing changed). Safe to run twice: the second run finds ARGV[2].
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] and not (cur == false and ARGV[4] == '1') then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
return 1
