-- budget: the prelude of every wake-budget script (prepended when the scripts are
-- loaded; Redis scripts cannot include one another).
--
-- usable_budget(key) returns the budget stored at key as an integer, or nil when
-- there is none. A value no script can use (another type than a string, a string
-- that is not an integer: written by someone else, or left by a bug) is deleted, so
-- one poisoned key cannot make every later script abort before its PUBLISH.
local function usable_budget(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return nil
  end
  if kind == 'string' then
    local budget = tonumber(redis.call('GET', key))
    if budget ~= nil and budget == math.floor(budget) and math.abs(budget) < 2^53 then
      return budget
    end
  end
  redis.call('DEL', key)
  return nil
end

