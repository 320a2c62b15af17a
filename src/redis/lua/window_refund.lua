-- The refund of window.rs, run atomically by Redis, on window.lua's counter.
-- KEYS[1]: the counter. ARGV[1]: amount (an integer, 0 or more), ARGV[2]:
-- the window it gives back to (the id its consume answered; 0: none named).
-- Returns { count, resetMs }, or { 0, 0 } when no window is open, or the open
-- one is not the window named: then it writes nothing. Never takes the count
-- below 0.
local key, amount = KEYS[1], tonumber(ARGV[1])
local taken_in = tonumber(ARGV[2]) or 0

local function stored_count()
  local count = tonumber(redis.call('GET', key))
  if count == nil or count % 1 ~= 0 then
    error({ err = 'NOTCOUNTER the key holds a value that is not an integer counter' })
  end
  return count
end

local pttl = redis.call('PTTL', key)
if pttl < 1 then
  if pttl == -1 then
    stored_count()
  end
  return { 0, 0 }
end
local count = stored_count()
if taken_in ~= 0 and redis.call('PEXPIRETIME', key) ~= taken_in then
  return { 0, 0 }
end
local taken = math.min(amount, math.max(count, 0))
if taken > 0 then
  count = redis.call('DECRBY', key, string.format('%.0f', taken))
end
return { count, pttl }
