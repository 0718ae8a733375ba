-- result.lua: helpers for a record's result part, put in front of the
-- scripts that read it (claim.lua, forget.lua; see store.go). The result
-- part (record.go) is uvarint last_status, uvarint length, last_error,
-- then 0x02 when the record is maybe processed, then optionally 0x01 and a
-- stored response.

-- uvarint reads the unsigned varint at s[i]; it returns the value and
-- the index after it, or nil past the end of s.
local function uvarint(s, i)
  local n, shift = 0, 1
  repeat
    local b = string.byte(s, i)
    if not b then
      return nil
    end
    i = i + 1
    n = n + (b % 128) * shift
    shift = shift * 128
  until b < 128
  return n, i
end

-- markIndex returns the index in result where the maybe-processed tag is
-- or would go (after last_error), or nil when result holds no last_status
-- and last_error (it is empty).
local function markIndex(result)
  local _, i = uvarint(result, 1)
  if not i then
    return nil
  end
  local n
  n, i = uvarint(result, i)
  if not n then
    return nil
  end
  return i + n
end

